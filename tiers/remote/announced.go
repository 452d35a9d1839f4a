package remote

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvtier/kvtier/offload"
)

// DefaultMaxAnnounced bounds the keys an Events remembers as announced
// (about 100 bytes each).
const DefaultMaxAnnounced = 1 << 20

// announced is the set of keys a tier announced stored and has not
// announced removed: what a router's index holds for the tier. It is what
// reconciliation compares with the server, so that a removal lost while
// the tier could not see it (a keyspace subscription down, a server that
// restarted empty, an object store's lifecycle rule) is published late
// rather than never. Guarded by Events.mu.
type announced struct {
	gen   uint64                 // announcements so far
	keys  map[offload.Key]uint64 // key → gen of its latest announcement
	order []annEntry             // announcement order, for the bound; stale entries skipped
	max   int
}

type annEntry struct {
	key offload.Key
	gen uint64
}

// add records keys as announced and returns the keys the bound pushes out
// (the oldest): their removal is published at once, so that the index
// never holds a key the tier has forgotten it announced.
func (a *announced) add(keys []offload.Key) (evicted []offload.Key) {
	if a.keys == nil {
		a.keys = make(map[offload.Key]uint64)
	}
	for _, k := range keys {
		a.gen++
		a.keys[k] = a.gen
		a.order = append(a.order, annEntry{k, a.gen})
	}
	for len(a.keys) > a.max && len(a.order) > 0 {
		e := a.order[0]
		a.order = a.order[1:]
		if g, ok := a.keys[e.key]; ok && g == e.gen {
			delete(a.keys, e.key)
			evicted = append(evicted, e.key)
		}
	}
	if len(a.order) > 2*len(a.keys)+1024 {
		live := make([]annEntry, 0, len(a.keys)+16)
		for _, e := range a.order {
			if g, ok := a.keys[e.key]; ok && g == e.gen {
				live = append(live, e)
			}
		}
		a.order = live
	}
	return evicted
}

// remove deletes keys and returns those that were announced.
func (a *announced) remove(keys []offload.Key) []offload.Key {
	var out []offload.Key
	for _, k := range keys {
		if _, ok := a.keys[k]; ok {
			delete(a.keys, k)
			out = append(out, k)
		}
	}
	return out
}

// Announced returns how many keys are announced and not removed.
func (e *Events) Announced() int {
	if e == nil {
		return 0
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.ann.keys)
}

// CheckFunc reports for each key whether the server holds it. An error
// means the answer is unknown: reconciliation then publishes nothing for
// that batch.
type CheckFunc func(ctx context.Context, keys []offload.Key) ([]bool, error)

// ReconcileOptions bound one reconciliation pass.
type ReconcileOptions struct {
	// Batch is the number of keys per check call (default 256).
	Batch int
	// Rate bounds the keys checked per second (0 = unbounded), so that a
	// pass over a large index does not load the server.
	Rate int
}

// Reconcile checks every key announced before the call with check and
// publishes the removal of those the server no longer holds. A key
// announced again while the pass runs is left alone: its new store may
// have landed after the check. It returns how many keys it checked and
// how many removals it published; it stops at the first failed check or
// when ctx ends.
func (e *Events) Reconcile(ctx context.Context, check CheckFunc, opt ReconcileOptions) (checked, removed int, err error) {
	if e == nil {
		return 0, 0, nil
	}
	batch := opt.Batch
	if batch <= 0 {
		batch = 256
	}
	e.mu.Lock()
	snap := e.ann.gen
	keys := make([]offload.Key, 0, len(e.ann.keys))
	for k := range e.ann.keys {
		keys = append(keys, k)
	}
	e.mu.Unlock()
	start := time.Now()
	for i := 0; i < len(keys); i += batch {
		b := keys[i:min(i+batch, len(keys))]
		present, err := check(ctx, b)
		if err == nil && len(present) != len(b) {
			err = fmt.Errorf("check answered %d of %d keys", len(present), len(b))
		}
		if err != nil {
			return checked, removed, err
		}
		checked += len(b)
		var gone []offload.Key
		e.mu.Lock()
		for j, k := range b {
			if g, ok := e.ann.keys[k]; ok && !present[j] && g <= snap {
				delete(e.ann.keys, k)
				gone = append(gone, k)
			}
		}
		if len(gone) > 0 {
			e.appendLocked(gone, true)
		}
		e.mu.Unlock()
		removed += len(gone)
		if opt.Rate > 0 {
			// Pace to Rate keys per second over the whole pass.
			due := start.Add(time.Duration(float64(checked) / float64(opt.Rate) * float64(time.Second)))
			if d := time.Until(due); d > 0 {
				t := time.NewTimer(d)
				select {
				case <-ctx.Done():
					t.Stop()
					return checked, removed, ctx.Err()
				case <-t.C:
				}
			}
		}
	}
	return checked, removed, nil
}

// Reconciler runs Reconcile when triggered (a resubscription, a server
// back from an outage) and every Interval, while the server is healthy.
type Reconciler struct {
	events   *Events
	check    CheckFunc
	opt      ReconcileOptions
	interval time.Duration
	healthy  func() bool
	log      *slog.Logger
	trigger  chan struct{}

	runs, removed, failed atomic.Int64
}

// ReconcilerConfig configures a Reconciler.
type ReconcilerConfig struct {
	Events   *Events
	Check    CheckFunc
	Options  ReconcileOptions
	Interval time.Duration // between periodic passes (<= 0: only when triggered)
	Healthy  func() bool   // nil: always
	Logger   *slog.Logger
}

// StartReconciler starts the loop on wg; it ends with ctx. It returns nil
// when cfg.Events is nil (the tier's events are off: nothing to keep true).
func StartReconciler(ctx context.Context, wg *sync.WaitGroup, cfg ReconcilerConfig) *Reconciler {
	if cfg.Events == nil {
		return nil
	}
	r := &Reconciler{events: cfg.Events, check: cfg.Check, opt: cfg.Options, interval: cfg.Interval,
		healthy: cfg.Healthy, log: cfg.Logger, trigger: make(chan struct{}, 1)}
	if r.log == nil {
		r.log = slog.Default()
	}
	wg.Add(1)
	go r.loop(ctx, wg)
	return r
}

// Trigger asks for a pass soon; triggers while one is pending coalesce.
// Safe on a nil Reconciler.
func (r *Reconciler) Trigger() {
	if r == nil {
		return
	}
	select {
	case r.trigger <- struct{}{}:
	default:
	}
}

// ReconcileStats counts passes and what they found.
type ReconcileStats struct {
	Runs, Removed, Failed int64
}

// Stats returns the counters; zero for a nil Reconciler.
func (r *Reconciler) Stats() ReconcileStats {
	if r == nil {
		return ReconcileStats{}
	}
	return ReconcileStats{Runs: r.runs.Load(), Removed: r.removed.Load(), Failed: r.failed.Load()}
}

func (r *Reconciler) loop(ctx context.Context, wg *sync.WaitGroup) {
	defer wg.Done()
	var tick <-chan time.Time
	if r.interval > 0 {
		t := time.NewTicker(r.interval)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.trigger:
		case <-tick:
		}
		if r.healthy != nil && !r.healthy() {
			continue // the recovery triggers a pass
		}
		checked, removed, err := r.events.Reconcile(ctx, r.check, r.opt)
		r.runs.Add(1)
		r.removed.Add(int64(removed))
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			r.failed.Add(1)
			r.log.Warn("reconciling announced blocks with the server failed; will retry", "checked", checked, "removed", removed, "err", err)
		case removed > 0:
			r.log.Info("published removals of blocks the server no longer holds", "checked", checked, "removed", removed)
		}
	}
}
