package tierset

import (
	"context"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"unicode"

	"github.com/kvtier/kvtier/config"
	"github.com/kvtier/kvtier/explain"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/tiers/peer"
	"github.com/kvtier/kvtier/tiers/redis"
	"github.com/kvtier/kvtier/tiers/remote"
	"github.com/kvtier/kvtier/tiers/s3"
)

// planS3 decodes an s3 entry over s3.DefaultConfig: its keys are
// s3.Config's yaml keys. As for fs, the daemon's namespace fills the
// layout fields the entry leaves unset (so an s3 prefix holds the tree an
// fs root with the same namespace would), and the daemon-wide events
// switch gates the tier's events. Declaring checks everything
// s3.Config.Validate checks; only Build contacts the service.
func planS3(spec config.TierSpec, cfg *config.Config) (plan, error) {
	c := s3.DefaultConfig()
	if err := spec.Decode(&c); err != nil {
		return plan{}, err
	}
	loc, err := parseLocality(spec, c.Locality)
	if err != nil {
		return plan{}, err
	}
	c.Name = spec.Name
	if c.Namespace.ModelName == "" {
		c.Namespace.ModelName = cfg.Namespace.Model
	}
	if c.Namespace.BlockBytes == 0 {
		c.Namespace.BlockBytes, _ = cfg.Namespace.BytesPerBlock.Int()
	}
	if c.Shares, err = tierShares(cfg, spec.Name); err != nil {
		return plan{}, err
	}
	if err := c.Validate(); err != nil {
		return plan{}, keyPathError(spec, c, err)
	}
	ignored := gateEvents(&c.Events, cfg)
	return plan{
		decl: explain.Declaration{Name: spec.Name, Type: s3.Type, Medium: offload.MediumStorage, Locality: loc},
		build: func(ctx context.Context, opts Options) (offload.SecondaryTier, error) {
			c := c
			c.Logger = opts.Logger
			if ignored {
				warnEventsIgnored(opts.Logger, c.Name, s3.Type)
			}
			t, err := s3.New(ctx, c)
			if err != nil {
				return nil, err // not a typed nil in the interface
			}
			return t, nil
		},
	}, nil
}

// planRedis decodes a redis entry over redis.DefaultConfig: its keys are
// redis.Config's yaml keys. The tier is remote DRAM: medium CPU, the
// configured locality. Declaring checks everything redis.Config.Validate
// checks; only Build connects.
func planRedis(spec config.TierSpec, cfg *config.Config) (plan, error) {
	c := redis.DefaultConfig()
	if err := spec.Decode(&c); err != nil {
		return plan{}, err
	}
	loc, err := parseLocality(spec, c.Locality)
	if err != nil {
		return plan{}, err
	}
	c.Name = spec.Name
	if !spec.Has("key_prefix") {
		c.KeyPrefix = redisKeyPrefix(cfg)
	}
	if c.Shares, err = tierShares(cfg, spec.Name); err != nil {
		return plan{}, err
	}
	if err := c.Validate(); err != nil {
		return plan{}, keyPathError(spec, c, err)
	}
	ignored := gateEvents(&c.Events, cfg)
	return plan{
		decl: explain.Declaration{Name: spec.Name, Type: redis.Type, Medium: offload.MediumCPU, Locality: loc},
		build: func(ctx context.Context, opts Options) (offload.SecondaryTier, error) {
			c := c
			c.Logger = opts.Logger
			if ignored {
				warnEventsIgnored(opts.Logger, c.Name, redis.Type)
			}
			t, err := redis.New(ctx, c)
			if err != nil {
				return nil, err
			}
			return t, nil
		},
	}, nil
}

// redisKeyPrefix is the default key prefix of a redis tier: it names the
// namespace's model and block size, so that daemons serving different
// models (or block sizes) from one Redis never read each other's blocks
// under the same engine hash. The fs and s3 tiers get the same separation
// from their digest directory.
func redisKeyPrefix(cfg *config.Config) string {
	model := strings.Map(func(r rune) rune {
		if unicode.IsSpace(r) || r == ':' {
			return '_'
		}
		return r
	}, cfg.Namespace.Model)
	bytes, _ := cfg.Namespace.BytesPerBlock.Int()
	return fmt.Sprintf("%s%s:%d:", redis.DefaultKeyPrefix, model, bytes)
}

// parseLocality reads a remote tier's locality key with the tiers' own
// parser (remote.ParseLocality, confvalue's: local or remote, absent for
// unspecified), so that explain and Build cannot disagree with the tier,
// and names the key in the error.
func parseLocality(spec config.TierSpec, s string) (offload.Locality, error) {
	l, err := remote.ParseLocality(s)
	if err != nil {
		return offload.LocalityUnspecified, spec.Errorf("locality", "invalid value %q (want local or remote)", s)
	}
	return l, nil
}

// gateEvents applies the daemon-wide events switch (docs/semantics.md §5.1): a tier
// that opts in while KV events are off globally stays inert. It reports
// whether the tier's opt-in was overridden, so that Build can warn.
func gateEvents(events *bool, cfg *config.Config) (ignored bool) {
	if *events && !cfg.Events.Enabled {
		*events = false
		return true
	}
	return false
}

// warnEventsIgnored logs the warning of docs/semantics.md §5.1, once per built tier.
func warnEventsIgnored(log *slog.Logger, name, typ string) {
	log.With("tier", name, "type", typ).Warn(fmt.Sprintf(
		"events is set on secondary tier '%s' but KV cache events are disabled globally; the tier will not emit events.", name))
}

// keyPathError rewrites an error of a tier config's Validate, which reads
// `<type> tier "<name>": <key>: <problem>`, into one naming the key path
// (secondary_tiers[2].bucket: required) like every other config error.
// An error of another shape, or about a key the entry cannot spell, is
// reported against the entry.
func keyPathError(spec config.TierSpec, tierConfig any, err error) error {
	msg := strings.TrimPrefix(err.Error(), fmt.Sprintf("%s tier %q: ", spec.Type, spec.Name))
	if key, problem, ok := strings.Cut(msg, ": "); ok && hasYAMLKey(tierConfig, key) {
		return spec.Errorf(key, "%s", problem)
	}
	return spec.Errorf("", "%s", msg)
}

// hasYAMLKey reports whether the struct v has a field with yaml key key
// (or, for a path such as peers[0].addr, its first element).
func hasYAMLKey(v any, key string) bool {
	if i := strings.IndexAny(key, "[."); i > 0 {
		key = key[:i]
	}
	t := reflect.TypeOf(v)
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		if name == key && name != "-" {
			return true
		}
	}
	return false
}

func planPeer(spec config.TierSpec, _ *config.Config) (plan, error) {
	var c peer.Config
	if err := spec.Decode(&c); err != nil {
		return plan{}, err
	}
	c.Name = spec.Name
	if err := c.Validate(); err != nil {
		return plan{}, keyPathError(spec, c, err)
	}
	return plan{
		// Dynamic on both axes: the tier applies each request's filter
		// per peer.
		decl:    explain.Declaration{Name: spec.Name, Type: peer.Type, Medium: offload.MediumUnspecified, Locality: offload.LocalityUnspecified},
		details: explain.Details{Parts: peer.PartsOf(c), ReadOnly: !c.Push},
		build: func(_ context.Context, opts Options) (offload.SecondaryTier, error) {
			c := c
			c.Logger = opts.Logger
			c.Peers = slices.Clone(c.Peers)
			for i := range c.Peers {
				p := &c.Peers[i]
				if p.TokenEnv == "" {
					continue
				}
				if p.Token != "" {
					return nil, spec.Errorf(fmt.Sprintf("peers[%d].token_env", i), "set token or token_env, not both")
				}
				tok, err := config.TokenFromEnv(p.TokenEnv)
				if err != nil {
					return nil, spec.Errorf(fmt.Sprintf("peers[%d].token_env", i), "%v", err)
				}
				p.Token = tok
			}
			t, err := peer.New(c)
			if err != nil {
				return nil, err
			}
			return t, nil
		},
	}, nil
}
