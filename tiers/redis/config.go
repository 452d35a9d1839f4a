package redis

import (
	"fmt"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/kvtier/kvtier/confvalue"
	"github.com/kvtier/kvtier/tiers/remote"
	"github.com/kvtier/kvtier/tlsconfig"
)

// Config configures a Redis tier. The yaml tags are the type-specific
// keys of a `type: redis` entry of `secondary_tiers`. Decode into
// DefaultConfig() so that absent keys keep their defaults; New also fills
// zero values of the sizing and timing fields with the defaults.
type Config struct {
	// Name is the tier name in its stack (the config entry's name).
	Name string `yaml:"-"`

	// Addr is the server's host:port (required unless Cluster).
	Addr string `yaml:"addr"`
	// Cluster makes the tier a Redis Cluster (or Valkey cluster) client:
	// Addrs are seed nodes (host:port; Addr counts as one more), keys
	// spread over the cluster's slots, pipelines are split per node, MOVED
	// and ASK redirections and failovers are followed by the client, and
	// keyspace events are subscribed on every master.
	Cluster bool     `yaml:"cluster"`
	Addrs   []string `yaml:"addrs"`
	// Username (Redis 6 ACL) and Password authenticate; DB selects the
	// logical database (0..15 on a default server).
	Username string `yaml:"username"`
	Password string `yaml:"password"`
	DB       int    `yaml:"db"`
	// TLS talks TLS to the server, or to every node of a cluster (a
	// server's tls-port; a managed service with in-transit encryption):
	// ca_file to trust (default: the system's roots), cert_file and
	// key_file for servers that require client certificates
	// (tls-auth-clients), server_name to check instead of the host
	// dialled. Blocks carry what prompts computed: a store shared across
	// hosts should not see them in the clear.
	TLS *tlsconfig.ClientFiles `yaml:"tls"`
	// KeyPrefix starts every key the tier writes. Each namespace (model)
	// needs its own so that they never share blocks and removals are
	// attributed correctly: a tier built from a config file (package
	// tierset) defaults to kvtier:<model>:<bytes_per_block>:, a tier built
	// in Go to DefaultKeyPrefix.
	KeyPrefix string `yaml:"key_prefix"`
	// TTL expires blocks after this long without a store or a touch
	// (0: no expiry; eviction is then the server's maxmemory policy).
	TTL time.Duration `yaml:"ttl"`
	// MaxValueBytes bounds one stored value, envelope included (default
	// 512 MiB, Redis's proto-max-bulk-len); a block beyond it fails its
	// store job.
	MaxValueBytes confvalue.ByteSize `yaml:"max_value_bytes"`
	// PoolSize bounds concurrent transfer pipelines and sizes the client's
	// connection pool (default 16); go-redis adds a small pool of its own
	// for pipelines.
	PoolSize int `yaml:"pool_size"`
	// DialTimeout bounds connecting (default 2s).
	DialTimeout time.Duration `yaml:"dial_timeout"`
	// KeyspaceEvents subscribes to the server's evicted, expired and del
	// key-event notifications (enabling them with CONFIG SET when
	// allowed) so that blocks the server drops are reported as removed.
	KeyspaceEvents bool `yaml:"keyspace_events"`

	// Shared: locality, max_inflight (default 256), timeout (one attempt
	// of one command or pipeline, default 5s), lookup_timeout (a step's
	// pipeline of existence checks, default 1s), retries (default 2),
	// retry_backoff (default 20ms), probe_interval (default 1s),
	// unhealthy_after (default 3), lookup_batch (default 1024), events
	// (stored events, and removed ones for blocks the server dropped —
	// keyspace events — or the tier deleted as corrupt),
	// reconcile_interval (default 10m; a pass also follows every
	// resubscription of the keyspace events) and reconcile_rate (default
	// 5000).
	remote.Shared `yaml:",inline"`

	// Logger defaults to slog.Default().
	Logger *slog.Logger `yaml:"-"`
}

// Defaults.
const (
	DefaultKeyPrefix     = "kvtier:"
	DefaultMaxValueBytes = 512 << 20
	DefaultPoolSize      = 16
	DefaultDialTimeout   = 2 * time.Second
	DefaultTimeout       = 5 * time.Second
	DefaultLookupTimeout = time.Second
	DefaultRetryBackoff  = 20 * time.Millisecond
	DefaultProbeInterval = remote.DefaultProbeInterval
)

// defaultShared are a Redis tier's defaults of the keys every remote tier
// has.
func defaultShared() remote.Shared {
	return remote.Shared{
		MaxInflight: remote.DefaultMaxInflight, Timeout: DefaultTimeout, LookupTimeout: DefaultLookupTimeout,
		Retries: remote.DefaultRetries, RetryBackoff: DefaultRetryBackoff, ProbeInterval: DefaultProbeInterval,
		UnhealthyAfter: remote.DefaultUnhealthyAfter, LookupBatch: remote.DefaultLookupBatch,
		ReconcileInterval: remote.DefaultReconcileInterval, ReconcileRate: remote.DefaultReconcileRate,
	}
}

// DefaultConfig returns a Config with every default filled in; decode the
// YAML keys over it.
func DefaultConfig() Config {
	return Config{
		KeyPrefix:     DefaultKeyPrefix,
		MaxValueBytes: DefaultMaxValueBytes,
		PoolSize:      DefaultPoolSize,
		DialTimeout:   DefaultDialTimeout,
		Shared:        defaultShared(),
	}
}

func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.KeyPrefix == "" {
		c.KeyPrefix = d.KeyPrefix
	}
	if c.MaxValueBytes == 0 {
		c.MaxValueBytes = d.MaxValueBytes
	}
	if c.PoolSize == 0 {
		c.PoolSize = d.PoolSize
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = d.DialTimeout
	}
	c.Shared = c.Shared.WithDefaults(d.Shared)
	return c
}

// seeds returns the addresses to dial: Addr, then Addrs.
func (c Config) seeds() []string {
	var out []string
	if c.Addr != "" {
		out = append(out, c.Addr)
	}
	return append(out, c.Addrs...)
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Validate checks c as New would (zero sizing and timing fields take
// their defaults) without connecting; errors name the offending key.
func (c Config) Validate() error {
	c = c.withDefaults()
	bad := func(key string, format string, args ...any) error {
		return fmt.Errorf("redis tier %q: %s: %s", c.Name, key, fmt.Sprintf(format, args...))
	}
	switch {
	case c.Cluster && c.Addr == "" && len(c.Addrs) == 0:
		return bad("addrs", "required with cluster: true (seed nodes, host:port)")
	case !c.Cluster && len(c.Addrs) > 0:
		return bad("addrs", "needs cluster: true (a single server takes addr)")
	case !c.Cluster && c.Addr == "":
		return bad("addr", "required (host:port)")
	case c.Cluster && c.DB != 0:
		return bad("db", "must be 0 with cluster: true (a cluster has one database), got %d", c.DB)
	}
	for i, a := range c.seeds() {
		if _, port, err := net.SplitHostPort(a); err != nil || port == "" {
			key := "addr"
			if c.Cluster && (c.Addr == "" || i > 0) {
				key = fmt.Sprintf("addrs[%d]", i-b2i(c.Addr != ""))
			}
			return bad(key, "%q is not host:port", a)
		}
	}
	if c.DB < 0 {
		return bad("db", "must be >= 0, got %d", c.DB)
	}
	if strings.ContainsAny(c.KeyPrefix, " \t\r\n") {
		return bad("key_prefix", "%q must not contain whitespace", c.KeyPrefix)
	}
	if c.TTL < 0 {
		return bad("ttl", "must be >= 0, got %v", c.TTL)
	}
	if c.TTL > 0 && c.TTL < time.Millisecond {
		return bad("ttl", "must be at least 1ms, got %v", c.TTL)
	}
	if c.MaxValueBytes <= 0 {
		return bad("max_value_bytes", "must be > 0, got %d", c.MaxValueBytes)
	}
	if _, err := remote.ParseLocality(c.Locality); err != nil {
		return bad("locality", "%v", err)
	}
	if _, err := c.TLS.Config(); err != nil {
		return bad("tls", "%v", err)
	}
	if err := c.Shared.Check([]remote.Count{{Key: "pool_size", Value: c.PoolSize}}, []remote.Span{{Key: "dial_timeout", Value: c.DialTimeout}}); err != nil {
		return fmt.Errorf("redis tier %q: %w", c.Name, err)
	}
	return nil
}
