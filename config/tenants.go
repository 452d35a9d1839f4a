package config

import (
	"fmt"
	"math"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/kvtier/kvtier/confvalue"
)

// Tenant is one customer of the daemon (kvtier serve): a token that
// reaches some namespaces, a key space of its own in each, and a share of
// the primary.
type Tenant struct {
	// Name identifies the tenant in metrics, logs, `kvtier stats
	// --tenant` and events; it names its key space, so renaming a tenant
	// orphans what it stored in persistent tiers.
	Name string `yaml:"name"`
	// Token (or TokenFile: its first line, trimmed; or TokenEnv: the
	// environment variable holding it, as a Kubernetes Secret is passed)
	// authenticates the tenant, on TCP and on the Unix socket. Set exactly
	// one.
	Token     string `yaml:"token"`
	TokenFile string `yaml:"token_file"`
	TokenEnv  string `yaml:"token_env"`
	// Namespaces are the API namespaces the token reaches; "default"
	// names the daemon's own namespace (API name ""). A call naming any
	// other is refused with PERMISSION_DENIED.
	Namespaces []string `yaml:"namespaces"`
	// Quota is the tenant's guaranteed share.
	Quota Quota `yaml:"quota"`
	// Weight scales how far above its quota the tenant may grow into
	// space no one else claims, relative to the others (default 1).
	Weight float64 `yaml:"weight"`
	// EventSalt is the salt the tenant's KV events carry where vLLM
	// writes a request's cache_salt (the first block's extra_keys), for a
	// router that knows it; "" uses "kvtier_tenant:<name>".
	EventSalt string `yaml:"event_salt"`
	// ClientCertCN binds the tenant to TLS client certificates (needs
	// server.tls.client_ca_file): a TCP or block-stream caller whose
	// verified certificate has this common name is the tenant without a
	// token, and the tenant's token is refused from a caller presenting
	// any other certificate.
	ClientCertCN string `yaml:"client_cert_cn"`
	// Events, with an endpoint, publishes the KV events of the tenant's
	// blocks in the daemon's own namespace on a ZMQ socket of their own
	// (its own sequence and replay), for the tenant's router alone, and
	// leaves them out of the shared events.endpoint. Needs events.enabled.
	Events TenantEvents `yaml:"events"`
}

// TenantEvents is a tenant's own KV event publisher (the other settings
// are events'). A tcp:// endpoint on loopback, or an ipc:// path whose
// directory only the tenant's router may enter, keeps other local
// processes from subscribing.
type TenantEvents struct {
	Endpoint       string `yaml:"endpoint"`
	ReplayEndpoint string `yaml:"replay_endpoint"`
	Topic          string `yaml:"topic"`
}

// countSet counts the non-empty strings of vs.
func countSet(vs ...string) int {
	n := 0
	for _, v := range vs {
		if v != "" {
			n++
		}
	}
	return n
}

// MinTokenLen is the shortest token the daemon accepts: 16 bytes, 128
// bits of randomness for a hex or base64 secret.
const MinTokenLen = 16

// CheckToken refuses a token too short to be a secret.
func CheckToken(tok string) error {
	if len(tok) < MinTokenLen {
		return fmt.Errorf("a token of %d bytes: at least %d (make one with: openssl rand -hex 16)", len(tok), MinTokenLen)
	}
	return nil
}

// TokenFromEnv reads a token from the environment variable name (a
// Kubernetes Secret passed as an env var): set, and long enough to be a
// secret. The daemon's own tokens and the peers' come this way.
func TokenFromEnv(name string) (string, error) {
	tok := strings.TrimSpace(os.Getenv(name))
	if tok == "" {
		return "", fmt.Errorf("$%s is unset or empty", name)
	}
	if err := CheckToken(tok); err != nil {
		return "", fmt.Errorf("$%s: %w", name, err)
	}
	return tok, nil
}

// MaxEventSalt bounds an event_salt's length.
const MaxEventSalt = 256

// Quota is a guaranteed share of the primary and of fs, redis, s3 and
// memory tiers: blocks of the tenant within it are never evicted by
// another tenant's stores.
type Quota struct {
	// Primary is the share of the daemon's primary (primary.bytes),
	// rounded down to whole blocks. 0: no guarantee, only what others
	// leave.
	Primary confvalue.ByteSize `yaml:"primary"`
	// Tiers are shares of secondary tiers' capacity, by tier name: of
	// fs, redis and s3 tiers with max_bytes (for redis and s3 a ledger
	// kvtier keeps of what it wrote, package remote's Budget) and of
	// memory tiers with capacity_blocks. A peer tier's capacity is the
	// peer daemon's DRAM, divided by that daemon's own tenants (a pushed
	// block keeps its tenant's key space, which the peer's config names
	// alike).
	Tiers map[string]confvalue.ByteSize `yaml:"tiers"`
}

// SharedSpace is a key space several tenants read and write together —
// a system prompt's blocks, say — reached as an API namespace of its own
// name that stores into the daemon's own namespace. Exactly this is
// shared: the blocks stored through that name, by any of its tenants or
// the admin. Each tenant's private keys, its request identifiers and its
// quota stay its own; shared blocks count against the space's quota, not
// the tenant that stored them.
type SharedSpace struct {
	Name    string   `yaml:"name"`
	Tenants []string `yaml:"tenants"`
	Quota   Quota    `yaml:"quota"`
	Weight  float64  `yaml:"weight"`
	// EventSalt: as Tenant.EventSalt, for the space's blocks.
	EventSalt string `yaml:"event_salt"`
}

// DefaultNamespaceName is how tenants' namespaces name the daemon's own
// namespace, whose API name is "".
const DefaultNamespaceName = "default"

// MaxTenants bounds tenants and shared spaces together (the primary's
// shares, the metrics' label values).
const MaxTenants = 64

var tenantNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)

// checkTenants applies the rules of tenants and shared_spaces.
func (c *Config) checkTenants(d *decoder) {
	if len(c.Tenants) == 0 && len(c.SharedSpaces) == 0 {
		return
	}
	if n := len(c.Tenants) + len(c.SharedSpaces); n > MaxTenants {
		d.errorf(nil, "tenants", "%d tenants and shared spaces, at most %d", n, MaxTenants)
		return
	}
	names := map[string]string{}
	tokens := map[string]string{}
	if c.Server.AuthToken != "" {
		tokens[c.Server.AuthToken] = "server.auth_token"
	}
	var quota confvalue.ByteSize
	name := func(path, n string) {
		switch {
		case !tenantNameRE.MatchString(n):
			d.errorf(nil, path+".name", "invalid name %q (want 1-64 letters, digits, '_', '.' or '-', starting with a letter or digit)", n)
		case names[n] != "":
			d.errorf(nil, path+".name", "duplicate name %q (also %s)", n, names[n])
		default:
			names[n] = path
		}
	}
	salts := map[string]string{}
	certs := map[string]string{}
	endpoints := map[string]string{}
	for _, ep := range []string{c.Events.Endpoint, c.Events.ReplayEndpoint} {
		if ep != "" {
			endpoints[ep] = "events"
		}
	}
	salt := func(path, name, v string) {
		if v == "" {
			v = "kvtier_tenant:" + name // events.SpacePrefix (config does not import events)
		}
		switch {
		case len(v) > MaxEventSalt:
			d.errorf(nil, path+".event_salt", "%d bytes, at most %d", len(v), MaxEventSalt)
		case salts[v] != "":
			d.errorf(nil, path+".event_salt", "the same salt as %s: a router could not tell the two spaces' blocks apart", salts[v])
		default:
			salts[v] = path
		}
	}
	share := func(path string, q Quota, w float64) {
		if q.Primary < 0 {
			d.errorf(nil, path+".quota.primary", "must not be negative, got %s", q.Primary)
		}
		quota += q.Primary
		if w < 0 || math.IsNaN(w) || math.IsInf(w, 0) {
			d.errorf(nil, path+".weight", "must be positive, got %v", w)
		}
	}
	for i := range c.Tenants {
		t := &c.Tenants[i]
		path := fmt.Sprintf("tenants[%d]", i)
		name(path, t.Name)
		switch n := countSet(t.Token, t.TokenFile, t.TokenEnv); {
		case n > 1:
			d.errorf(nil, path+".token_file", "set one of token, token_file and token_env")
		case n == 0:
			d.errorf(nil, path+".token", "required (or token_file, token_env): a tenant is known by its token")
		case t.Token != "":
			if err := CheckToken(t.Token); err != nil {
				d.errorf(nil, path+".token", "%v", err)
			}
			if other, dup := tokens[t.Token]; dup {
				d.errorf(nil, path+".token", "the same token as %s: every tenant needs its own", other)
			}
			tokens[t.Token] = path
		}
		if t.ClientCertCN != "" {
			if c.Server.TLS.ClientCAFile == "" {
				d.errorf(nil, path+".client_cert_cn", "needs server.tls.client_ca_file: only a verified client certificate names a tenant")
			}
			if other, dup := certs[t.ClientCertCN]; dup {
				d.errorf(nil, path+".client_cert_cn", "%q is also %s's", t.ClientCertCN, other)
			}
			certs[t.ClientCertCN] = path
		}
		if e := t.Events; e != (TenantEvents{}) {
			switch {
			case !c.Events.Enabled:
				d.errorf(nil, path+".events", "needs events.enabled")
			case e.Endpoint == "":
				d.errorf(nil, path+".events.endpoint", "required: the tenant's own publisher's socket")
			}
			for _, ep := range []string{e.Endpoint, e.ReplayEndpoint} {
				if ep == "" {
					continue
				}
				if other, dup := endpoints[ep]; dup {
					d.errorf(nil, path+".events", "endpoint %q is also %s's", ep, other)
				}
				endpoints[ep] = path
			}
		}
		if len(t.Namespaces) == 0 {
			d.errorf(nil, path+".namespaces", "required: the namespaces the tenant's token reaches (%q is the daemon's own)", DefaultNamespaceName)
		}
		share(path, t.Quota, t.Weight)
		salt(path, t.Name, t.EventSalt)
	}
	for i := range c.SharedSpaces {
		s := &c.SharedSpaces[i]
		path := fmt.Sprintf("shared_spaces[%d]", i)
		name(path, s.Name)
		if s.Name == DefaultNamespaceName {
			d.errorf(nil, path+".name", "%q is the daemon's namespace; name the shared space something else", s.Name)
		}
		if len(s.Tenants) == 0 {
			d.errorf(nil, path+".tenants", "required: the tenants that share the space")
		}
		for _, tn := range s.Tenants {
			if !slices.ContainsFunc(c.Tenants, func(t Tenant) bool { return t.Name == tn }) {
				d.errorf(nil, path+".tenants", "no tenant is called %q", tn)
			}
		}
		share(path, s.Quota, s.Weight)
		salt(path, s.Name, s.EventSalt)
	}
	c.checkTierQuotas(d)
	if c.Primary.Bytes > 0 && quota > c.Primary.Bytes {
		d.errorf(nil, "tenants", "the quotas add up to %s, more than primary.bytes = %s: a quota is a guarantee, and the primary cannot keep them all",
			quota, c.Primary.Bytes)
	}
	if c.Primary.Bytes == 0 && (quota > 0 || len(c.SharedSpaces) > 0) {
		d.errorf(nil, "tenants", "quotas and shared spaces need the daemon's primary (primary.bytes is 0)")
	}
}

// NamespaceName returns the API name of a namespace as tenants name it:
// "" for DefaultNamespaceName.
func NamespaceName(n string) string {
	if n == DefaultNamespaceName {
		return ""
	}
	return n
}

// checkTierQuotas checks quota.tiers: named fs, redis and s3 tiers with
// max_bytes and memory tiers with capacity_blocks, whose quotas fit in
// them.
func (c *Config) checkTierQuotas(d *decoder) {
	sums := map[string]confvalue.ByteSize{}
	check := func(path string, q Quota) {
		for name, b := range q.Tiers {
			p := path + ".quota.tiers." + name
			i := slices.IndexFunc(c.SecondaryTiers, func(t TierSpec) bool { return t.Name == name })
			switch {
			case i < 0:
				d.errorf(nil, p, "no secondary tier is called %q", name)
				continue
			case !slices.Contains([]string{"fs", "memory", "redis", "s3"}, c.SecondaryTiers[i].Type):
				d.errorf(nil, p, "tier %q is a %s tier: only fs, redis and s3 tiers (with max_bytes) and memory tiers (with capacity_blocks) divide their capacity between tenants; a peer's DRAM is its own daemon's to divide", name, c.SecondaryTiers[i].Type)
				continue
			case b < 0:
				d.errorf(nil, p, "must not be negative, got %s", b)
				continue
			}
			sums[name] += b
		}
	}
	for i, t := range c.Tenants {
		check(fmt.Sprintf("tenants[%d]", i), t.Quota)
	}
	for i, s := range c.SharedSpaces {
		check(fmt.Sprintf("shared_spaces[%d]", i), s.Quota)
	}
	names := make([]string, 0, len(sums))
	for n := range sums {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, name := range names {
		t := c.SecondaryTiers[slices.IndexFunc(c.SecondaryTiers, func(t TierSpec) bool { return t.Name == name })]
		capacity, key, what, ok := c.tierCapacity(t)
		switch {
		case !ok:
			d.errorf(nil, t.Path()+"."+key, "required by the tenants' quotas of tier %q: an unbounded tier evicts nothing to divide", name)
		case sums[name] > capacity:
			d.errorf(nil, "tenants", "the quotas of tier %q add up to %s, more than its %s", name, sums[name], what)
		}
	}
}

// tierCapacity returns the bytes an fs, redis or s3 tier (max_bytes) or a memory tier
// (capacity_blocks of namespace.bytes_per_block) holds at most, the key
// that bounds it, and that bound as an error message shows it; ok is
// false for an unbounded tier.
func (c *Config) tierCapacity(t TierSpec) (capacity confvalue.ByteSize, key, what string, ok bool) {
	if t.Type == "memory" {
		key = "capacity_blocks"
		n, err := strconv.ParseInt(t.Value(key), 10, 64)
		if err != nil || n <= 0 {
			return 0, key, "", false
		}
		capacity = confvalue.ByteSize(n) * c.Namespace.BytesPerBlock
		return capacity, key, fmt.Sprintf("capacity_blocks = %d × bytes_per_block %s = %s", n, c.Namespace.BytesPerBlock, capacity), true
	}
	key = "max_bytes"
	capacity, err := confvalue.ParseByteSize(t.Value(key))
	if err != nil || capacity == 0 {
		return 0, key, "", false
	}
	return capacity, key, fmt.Sprintf("max_bytes = %s", capacity), true
}

// TierShare is one tenant's or shared space's quota of a tier.
type TierShare struct {
	// Name is the tenant's or the shared space's; Shared tells which.
	Name   string
	Shared bool
	Bytes  confvalue.ByteSize
	Weight float64
}

// TierShares returns the quotas of tier name, in config order (tenants,
// then shared spaces); nil when no one has one.
func (c *Config) TierShares(name string) []TierShare {
	var out []TierShare
	for _, t := range c.Tenants {
		if b, ok := t.Quota.Tiers[name]; ok {
			out = append(out, TierShare{Name: t.Name, Bytes: b, Weight: t.Weight})
		}
	}
	for _, s := range c.SharedSpaces {
		if b, ok := s.Quota.Tiers[name]; ok {
			out = append(out, TierShare{Name: s.Name, Shared: true, Bytes: b, Weight: s.Weight})
		}
	}
	return out
}
