package remote

import (
	"fmt"
	"time"

	"github.com/kvtier/kvtier/confvalue"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/quota"
)

// ParseLocality reads a tier's locality key (confvalue.ParseLocality):
// local, remote, or empty for unspecified, with which the tier passes
// every locality matcher as an upstream tier without a locality does.
func ParseLocality(s string) (offload.Locality, error) {
	return confvalue.ParseLocality(s)
}

// Shared are the config keys every remote tier has, with the same name
// and meaning: a tier's Config embeds them inline (`yaml:",inline"`), so
// that an entry's keys stay one flat list. Their defaults differ by tier
// (each tier's DefaultConfig sets them); WithDefaults fills zero values
// from them and Check validates them with the tier's own keys.
type Shared struct {
	// Locality is local, remote, or empty for
	// unspecified: the tier then passes every locality matcher, as an
	// upstream tier without a locality does.
	Locality string `yaml:"locality"`
	// MaxInflight bounds jobs in flight; beyond it a job fails at once.
	MaxInflight int `yaml:"max_inflight"`
	// Timeout bounds one attempt of one transfer (a request, a command or
	// a pipeline); LookupTimeout bounds a step's existence checks, short
	// because a request waits (lookups answer Retry) until they are
	// answered.
	Timeout       time.Duration `yaml:"timeout"`
	LookupTimeout time.Duration `yaml:"lookup_timeout"`
	// Retries after a transient failure (connection error, timeout, an
	// overloaded server; 0 disables them), with exponential backoff from
	// RetryBackoff.
	Retries      int           `yaml:"retries"`
	RetryBackoff time.Duration `yaml:"retry_backoff"`
	// ProbeInterval is the pause between health probes while the server
	// is down; UnhealthyAfter the consecutive transport failures that
	// mark it down.
	ProbeInterval  time.Duration `yaml:"probe_interval"`
	UnhealthyAfter int           `yaml:"unhealthy_after"`
	// LookupBatch bounds the keys of one existence-check call; a step's
	// batch is split beyond it.
	LookupBatch int `yaml:"lookup_batch"`
	// Events makes the tier emit a stored event per successful store job
	// and removed events for blocks the server dropped or the tier
	// deleted as corrupt.
	Events bool `yaml:"events"`
	// ReconcileInterval is how often, with events on, the tier checks the
	// blocks it announced stored against the server and publishes the
	// removals it missed; a pass also follows every recovery from an
	// outage. ReconcileRate bounds the keys checked per second.
	ReconcileInterval time.Duration `yaml:"reconcile_interval"`
	ReconcileRate     int           `yaml:"reconcile_rate"`
	// MaxBytes bounds what the tier keeps on the server, envelopes
	// included (0: no bound of kvtier's; the server's own policy
	// evicts). With it the tier keeps a ledger of its blocks, lists the
	// server's at startup, and deletes its least recently used blocks to
	// make room (see Budget). Tenants' quotas of the tier (Shares) need
	// it.
	MaxBytes confvalue.ByteSize `yaml:"max_bytes"`
	// Shares divide MaxBytes between tenants (package quota); set by the
	// daemon from its tenants' quotas, not a key of the entry.
	Shares []quota.Share `yaml:"-"`
}

// Default values of Shared that are the same for every remote tier.
const (
	DefaultUnhealthyAfter    = 3
	DefaultMaxInflight       = 256
	DefaultProbeInterval     = time.Second
	DefaultLookupBatch       = 1024
	DefaultRetries           = 2
	DefaultReconcileInterval = 10 * time.Minute
	DefaultReconcileRate     = 5000
)

// WithDefaults returns s with its zero sizes and timings taken from d.
// Retries, Locality and Events keep their values: zero means what it says.
func (s Shared) WithDefaults(d Shared) Shared {
	set := func(v *int, def int) {
		if *v == 0 {
			*v = def
		}
	}
	span := func(v *time.Duration, def time.Duration) {
		if *v == 0 {
			*v = def
		}
	}
	set(&s.MaxInflight, d.MaxInflight)
	set(&s.UnhealthyAfter, d.UnhealthyAfter)
	set(&s.LookupBatch, d.LookupBatch)
	set(&s.ReconcileRate, d.ReconcileRate)
	span(&s.Timeout, d.Timeout)
	span(&s.LookupTimeout, d.LookupTimeout)
	span(&s.RetryBackoff, d.RetryBackoff)
	span(&s.ProbeInterval, d.ProbeInterval)
	span(&s.ReconcileInterval, d.ReconcileInterval)
	return s
}

// Count and Span name a tier's own config key that, like the shared
// sizes and timings, must be > 0.
type (
	Count struct {
		Key   string
		Value int
	}
	Span struct {
		Key   string
		Value time.Duration
	}
)

// Check returns the first key out of range, as "<key>: <problem>", in
// this order: the counts (the tier's own, then max_inflight,
// unhealthy_after, lookup_batch) must be > 0, retries >= 0, and the
// durations (the tier's own, then timeout, lookup_timeout, retry_backoff,
// probe_interval) > 0.
func (s Shared) Check(counts []Count, spans []Span) error {
	counts = append(counts[:len(counts):len(counts)],
		Count{"max_inflight", s.MaxInflight}, Count{"unhealthy_after", s.UnhealthyAfter}, Count{"lookup_batch", s.LookupBatch})
	for _, c := range counts {
		if c.Value <= 0 {
			return fmt.Errorf("%s: must be > 0, got %d", c.Key, c.Value)
		}
	}
	if s.MaxBytes < 0 {
		return fmt.Errorf("max_bytes: must be >= 0, got %d", s.MaxBytes)
	}
	if len(s.Shares) > 0 && s.MaxBytes == 0 {
		return fmt.Errorf("tenants' quotas need max_bytes: without it the server's own policy evicts, across tenants")
	}
	if s.Retries < 0 {
		return fmt.Errorf("retries: must be >= 0, got %d", s.Retries)
	}
	spans = append(spans[:len(spans):len(spans)],
		Span{"timeout", s.Timeout}, Span{"lookup_timeout", s.LookupTimeout}, Span{"retry_backoff", s.RetryBackoff}, Span{"probe_interval", s.ProbeInterval})
	for _, d := range spans {
		if d.Value <= 0 {
			return fmt.Errorf("%s: must be > 0, got %v", d.Key, d.Value)
		}
	}
	return nil
}
