package main

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/kvtier/kvtier/config"
	"github.com/kvtier/kvtier/cpu"
	"github.com/kvtier/kvtier/events"
	"github.com/kvtier/kvtier/keyspace"
	"github.com/kvtier/kvtier/server"
)

// tenantsOf returns the server's tenants and shared spaces, reading token
// files.
func tenantsOf(cfg *config.Config) ([]server.TenantConfig, []server.SharedSpaceConfig, error) {
	var ts []server.TenantConfig
	for i, t := range cfg.Tenants {
		tok := t.Token
		var err error
		switch {
		case t.TokenFile != "":
			if tok, err = readSecretToken(t.TokenFile); err != nil {
				return nil, nil, fmt.Errorf("tenants[%d].token_file: %w", i, err)
			}
		case t.TokenEnv != "":
			if tok, err = config.TokenFromEnv(t.TokenEnv); err != nil {
				return nil, nil, fmt.Errorf("tenants[%d].token_env: %w", i, err)
			}
		}
		ns := make([]string, len(t.Namespaces))
		for j, n := range t.Namespaces {
			ns[j] = config.NamespaceName(n)
		}
		ts = append(ts, server.TenantConfig{Name: t.Name, Token: tok, Namespaces: ns, ClientCertCN: t.ClientCertCN})
	}
	var ss []server.SharedSpaceConfig
	for _, s := range cfg.SharedSpaces {
		ss = append(ss, server.SharedSpaceConfig{Name: s.Name, Tenants: s.Tenants})
	}
	return ts, ss, nil
}

// readToken reads a token file: its first line, surrounding whitespace
// trimmed. A file that its group or others may read is refused: the token
// is a secret, and a file that leaks it is a mistake to fix, not to use.
func readToken(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", err
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return "", fmt.Errorf("%s: mode %04o lets its group or others read the token (chmod 600 %s)", path, perm, path)
	}
	b, err := io.ReadAll(io.LimitReader(f, 64<<10))
	if err != nil {
		return "", err
	}
	tok, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
	if tok = strings.TrimSpace(tok); tok == "" {
		return "", fmt.Errorf("%s: empty", path)
	}
	return tok, nil
}

// readSecretToken is readToken for a token the daemon accepts: long
// enough to be a secret.
func readSecretToken(path string) (string, error) {
	tok, err := readToken(path)
	if err != nil {
		return "", err
	}
	if err := config.CheckToken(tok); err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	return tok, nil
}

// primaryShares divides the daemon's primary between the tenants and the
// shared spaces by their quotas (whole blocks).
func primaryShares(cfg *config.Config) ([]cpu.Share, error) {
	block := int64(cfg.Namespace.BytesPerBlock)
	var out []cpu.Share
	for _, t := range cfg.Tenants {
		sp, err := keyspace.Tenant(t.Name)
		if err != nil {
			return nil, err
		}
		out = append(out, cpu.Share{Space: sp.ID(), Slots: int(int64(t.Quota.Primary) / block), Weight: t.Weight})
	}
	for _, s := range cfg.SharedSpaces {
		sp, err := keyspace.Shared(s.Name)
		if err != nil {
			return nil, err
		}
		out = append(out, cpu.Share{Space: sp.ID(), Slots: int(int64(s.Quota.Primary) / block), Weight: s.Weight})
	}
	return out, nil
}

// spaceSalts gives the events the salts of the tenants' and shared
// spaces' key spaces, by ID: the configured event_salt, or
// events.SpacePrefix and the space's name.
func spaceSalts(cfg *config.Config) map[uint64]string {
	if len(cfg.Tenants)+len(cfg.SharedSpaces) == 0 {
		return nil
	}
	m := map[uint64]string{}
	salt := func(name, set string) string {
		if set != "" {
			return set
		}
		return events.SpacePrefix + name
	}
	for _, t := range cfg.Tenants {
		if sp, err := keyspace.Tenant(t.Name); err == nil {
			m[sp.ID()] = salt(t.Name, t.EventSalt)
		}
	}
	for _, s := range cfg.SharedSpaces {
		if sp, err := keyspace.Shared(s.Name); err == nil {
			m[sp.ID()] = salt(s.Name, s.EventSalt)
		}
	}
	return m
}
