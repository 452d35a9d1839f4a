package server

import (
	"sync"
	"time"

	"github.com/kvtier/kvtier/offload"
)

// jobBounds are the upper bounds (seconds) of the job latency histograms:
// 100 µs to 26 s in steps of ×4.
var jobBounds = []float64{1e-4, 4e-4, 1.6e-3, 6.4e-3, 0.0256, 0.1024, 0.4096, 1.6384, 6.5536, 26.2144}

// TimeJobs wraps each tier so that the daemon's metrics get latency
// histograms of its promotions (loads) and cascades (stores). Build the
// manager with the returned tiers. A job's latency is the duration the
// tier reports, or the time from submission to the result being collected
// when the tier reports none. The wrappers forward every call unchanged;
// UnwrapTier returns the original.
func TimeJobs(tiers []offload.SecondaryTier) []offload.SecondaryTier {
	out := make([]offload.SecondaryTier, len(tiers))
	for i, t := range tiers {
		out[i] = &timedTier{SecondaryTier: t, started: make(map[uint64]jobStart)}
	}
	return out
}

// UnwrapTier returns the tier TimeJobs wrapped, or t itself.
func UnwrapTier(t offload.SecondaryTier) offload.SecondaryTier {
	if tt, ok := t.(*timedTier); ok {
		return tt.SecondaryTier
	}
	return t
}

type jobStart struct {
	at        time.Time
	promotion bool
}

// timedTier times the jobs of a tier. The manager calls a tier from one
// goroutine at a time, but the metrics scrape reads the histograms from
// another, hence the mutex.
type timedTier struct {
	offload.SecondaryTier

	mu          sync.Mutex
	started     map[uint64]jobStart
	load, store histogram
}

type histogram struct {
	counts [11]uint64 // len(jobBounds)+1, the last is +Inf
	sum    float64
	n      uint64
}

func (h *histogram) observe(d time.Duration) {
	s := d.Seconds()
	i := 0
	for i < len(jobBounds) && s > jobBounds[i] {
		i++
	}
	h.counts[i]++
	h.sum += s
	h.n++
}

// snapshot returns h as a cumulative Histogram.
func (h *histogram) snapshot() *Histogram {
	out := &Histogram{Bounds: jobBounds, Counts: make([]uint64, len(jobBounds)), Count: h.n, Sum: h.sum}
	var cum uint64
	for i := range jobBounds {
		cum += h.counts[i]
		out.Counts[i] = cum
	}
	return out
}

func (t *timedTier) note(j *offload.Job, promotion bool) {
	t.mu.Lock()
	t.started[j.ID] = jobStart{at: time.Now(), promotion: promotion}
	t.mu.Unlock()
}

func (t *timedTier) SubmitStore(j *offload.Job) {
	t.note(j, false)
	t.SecondaryTier.SubmitStore(j)
}

func (t *timedTier) SubmitLoad(j *offload.Job) {
	t.note(j, true)
	t.SecondaryTier.SubmitLoad(j)
}

func (t *timedTier) FinishedJobs() []offload.JobResult {
	rs := t.SecondaryTier.FinishedJobs()
	if len(rs) == 0 {
		return rs
	}
	now := time.Now()
	t.mu.Lock()
	for _, r := range rs {
		s, ok := t.started[r.JobID]
		if !ok {
			continue // not ours to time; the manager reports it
		}
		delete(t.started, r.JobID)
		d := r.Duration
		if d <= 0 {
			d = now.Sub(s.at)
		}
		if s.promotion {
			t.load.observe(d)
		} else {
			t.store.observe(d)
		}
	}
	t.mu.Unlock()
	return rs
}

// latency returns the load and store histograms.
func (t *timedTier) latency() (load, store *Histogram) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.load.snapshot(), t.store.snapshot()
}
