package remote

import (
	"fmt"
	"time"

	"github.com/kvtier/kvtier/offload"
)

// ParseLocality reads a tier's locality key: local, remote (or its
// synonym global), or empty for unspecified, with which the tier passes
// every locality matcher as an upstream tier without a locality does.
func ParseLocality(s string) (offload.Locality, error) {
	if s == "" {
		return offload.LocalityUnspecified, nil
	}
	l, ok := offload.ParseLocality(s)
	if !ok {
		return offload.LocalityUnspecified, fmt.Errorf("%q: want local or remote", s)
	}
	return l, nil
}

// Shared holds the values of the config keys every remote tier has with
// the same name and meaning. Each tier keeps them as flat fields of its
// own Config, so that an entry's keys stay one flat list, and hands them
// to Check.
type Shared struct {
	MaxInflight    int           // max_inflight
	UnhealthyAfter int           // unhealthy_after
	LookupBatch    int           // lookup_batch
	Retries        int           // retries
	Timeout        time.Duration // timeout
	LookupTimeout  time.Duration // lookup_timeout
	RetryBackoff   time.Duration // retry_backoff
	ProbeInterval  time.Duration // probe_interval
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
