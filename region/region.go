package region

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvtier/kvtier/offload"
)

// Found is a lookup's answer for one key.
type Found uint8

const (
	// Unknown: a tier the request may load from has not settled within
	// Config.LookupWait; ask again.
	Unknown Found = iota
	// Miss: no tier the request may load from holds the block.
	Miss
	// Hit: a tier holds it; a promotion job for the request loads it from
	// that tier.
	Hit
)

// Job is one of an engine's transfer jobs: a store (cascade) of the
// blocks in Slots to the tiers the request's store filter allows, or a
// promotion (Promotion) of Keys into Slots from the tiers that answered
// Hit. ID is the engine's; it must not repeat among the region's jobs in
// flight.
type Job struct {
	ID        uint64
	RequestID string
	Keys      []offload.Key
	Slots     []int64
	Promotion bool
}

// Result is a job's outcome. For a promotion that loaded only some of its
// keys, Loaded lists their indexes in the job's keys, in order.
type Result struct {
	JobID   uint64
	Success bool
	Loaded  []int
}

// Touch refreshes the recency of a request's keys in the tiers.
type Touch struct {
	RequestID string
	Keys      []offload.Key
}

// Region is one engine's registered region. Its methods are safe for
// concurrent use.
type Region struct {
	id     string
	layout Layout
	g      *group
	m      *mapping
	svc    *Service

	// steps counts the engine's step ends (Step calls), which date its
	// promotions in engine steps.
	steps atomic.Uint64

	mu            sync.Mutex
	results       []Result
	events        []offload.Event
	eventsDropped uint64
	closing       bool
	notify        chan struct{} // a result is queued, or the region closes
	drained       chan struct{} // closed by the executor once closing and idle

	// inflight counts the region's jobs without an outcome; owned by the
	// executor.
	inflight int
	// jobIDs are the engine's job ids in flight, and idleWaiters the
	// Drain calls waiting for none; owned by the executor.
	jobIDs      map[uint64]struct{}
	idleWaiters []chan struct{}
	// reqs counts the region's requests in its group's table (bounded by
	// Config.MaxRequests); owned by the executor.
	reqs int
}

// ID is the region's id: what the engine names it by in every call.
func (r *Region) ID() string { return r.id }

// Layout is the layout the region was registered with.
func (r *Region) Layout() Layout { return r.layout }

// Namespace is the name of the namespace whose tiers the region uses.
func (r *Region) Namespace() string { return r.g.name }

func (r *Region) live() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closing {
		return fmt.Errorf("%w: region %s", ErrClosed, r.id)
	}
	return nil
}

// Lookup answers, for each key, whether a tier request id may load from
// holds it. params are the request's kv_transfer_params, read the first
// time the region names the request. It waits (up to Config.LookupWait,
// or ctx) for tiers that answer asynchronously.
func (r *Region) Lookup(ctx context.Context, id string, params []byte, keys []offload.Key) ([]Found, error) {
	return r.LookupWithin(ctx, id, params, keys, 0)
}

// LookupWithin is Lookup waiting at most wait (0: Config.LookupWait) for
// the tiers that answer asynchronously.
func (r *Region) LookupWithin(ctx context.Context, id string, params []byte, keys []offload.Key, wait time.Duration) ([]Found, error) {
	a, err := r.LookupMany(ctx, []LookupEntry{{RequestID: id, Params: params, Keys: keys}}, wait)
	if err != nil {
		return nil, err
	}
	return a[0].Found, a[0].Err
}

// LookupEntry is one request's lookup in a LookupMany.
type LookupEntry struct {
	RequestID string
	Params    []byte
	Keys      []offload.Key
}

// LookupAnswer is one request's answer in a LookupMany: Found for each
// key, or the error that kept it from being answered.
type LookupAnswer struct {
	Found []Found
	Err   error
}

// LookupMany is Lookup for many requests at once (an engine step's
// lookups), each waiting at most wait (0: Config.LookupWait): they are all
// put to the tiers in one turn of the namespace's executor and wait
// together, so the call takes as long as its slowest request, not the sum
// of them. An entry's own failure (its request could not be created) is
// its answer's Err; the call fails only when the region is gone or ctx
// ends.
func (r *Region) LookupMany(ctx context.Context, entries []LookupEntry, wait time.Duration) ([]LookupAnswer, error) {
	if err := r.live(); err != nil {
		return nil, err
	}
	replies := make([]chan lookupReply, len(entries))
	for i := range replies {
		replies[i] = make(chan lookupReply, 1)
	}
	if err := r.g.do(ctx, func() {
		for i, e := range entries {
			r.g.lookup(r, e.RequestID, e.Params, e.Keys, wait, replies[i])
		}
	}); err != nil {
		return nil, err
	}
	out := make([]LookupAnswer, len(entries))
	for i, reply := range replies {
		select {
		case rep := <-reply:
			out[i] = LookupAnswer{Found: rep.found, Err: rep.err}
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return out, nil
}

// Submit hands the engine's jobs to the namespace's tiers; their outcomes
// arrive through NextResults. params (co-indexed with jobs, entries may be
// nil) are read for requests the region has not named before.
func (r *Region) Submit(ctx context.Context, jobs []Job, params [][]byte) error {
	if err := r.live(); err != nil {
		return err
	}
	for _, j := range jobs {
		if len(j.Keys) == 0 || len(j.Keys) != len(j.Slots) {
			return fmt.Errorf("%w: job %d has %d keys and %d slots", ErrLayout, j.ID, len(j.Keys), len(j.Slots))
		}
		for k, s := range j.Slots {
			if s < 0 || s >= int64(r.layout.NumBlocks) {
				return fmt.Errorf("%w: job %d: slot %d of keys[%d] is outside the region's %d blocks", ErrLayout, j.ID, s, k, r.layout.NumBlocks)
			}
			if !j.Keys[k].Valid() {
				return fmt.Errorf("%w: job %d: keys[%d] is not a valid key", ErrLayout, j.ID, k)
			}
		}
	}
	reply := make(chan error, 1)
	if err := r.g.do(ctx, func() { reply <- r.g.submit(r, jobs, params) }); err != nil {
		return err
	}
	select {
	case err := <-reply:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// NextResults returns the outcomes queued since the last call, waiting
// for at least one (bounded by ctx). After Close it returns what is left,
// then ErrClosed.
func (r *Region) NextResults(ctx context.Context) ([]Result, error) {
	for {
		r.mu.Lock()
		if len(r.results) > 0 {
			out := r.results
			r.results = nil
			r.mu.Unlock()
			return out, nil
		}
		closing := r.closing
		r.mu.Unlock()
		if closing {
			return nil, fmt.Errorf("%w: region %s", ErrClosed, r.id)
		}
		select {
		case <-r.notify:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// push queues results for NextResults (called by the executor).
func (r *Region) push(res Result) {
	r.mu.Lock()
	r.results = append(r.results, res)
	r.mu.Unlock()
	select {
	case r.notify <- struct{}{}:
	default:
	}
}

// pushEvents queues the namespace's tier events for the engine's next
// step, dropping the oldest beyond Config.MaxEvents.
func (r *Region) pushEvents(ev []offload.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closing {
		return
	}
	r.events = append(r.events, ev...)
	if over := len(r.events) - r.svc.cfg.MaxEvents; over > 0 {
		r.eventsDropped += uint64(over)
		r.events = append(r.events[:0], r.events[over:]...)
	}
}

// Step ends an engine step: requests it finished are forgotten once their
// jobs are answered, touches refresh recency, and the tier events
// buffered since the last step are returned.
func (r *Region) Step(ctx context.Context, finished []string, touches []Touch) ([]offload.Event, error) {
	if err := r.live(); err != nil {
		return nil, err
	}
	r.steps.Add(1)
	if len(finished) > 0 || len(touches) > 0 {
		if err := r.g.do(ctx, func() { r.g.step(r, finished, touches) }); err != nil {
			return nil, err
		}
	}
	r.mu.Lock()
	ev := r.events
	r.events = nil
	r.mu.Unlock()
	return ev, nil
}

// Drain waits until none of the region's jobs is in flight (bounded by
// ctx): then no tier touches its memory and every outcome is queued.
func (r *Region) Drain(ctx context.Context) error {
	idle := make(chan struct{})
	if err := r.g.do(ctx, func() { r.g.whenIdle(r, idle) }); err != nil {
		return err
	}
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close ends the region: new calls fail, the requests it named are
// finished, and once its transfers in flight are answered (bounded by ctx
// and Config.CloseWait) it is unmapped. Closing twice is a no-op.
func (r *Region) Close(ctx context.Context) error {
	r.mu.Lock()
	if r.closing {
		r.mu.Unlock()
		return nil
	}
	r.closing = true
	r.mu.Unlock()
	select {
	case r.notify <- struct{}{}: // wake NextResults
	default:
	}
	ctx, cancel := context.WithTimeout(ctx, r.svc.cfg.CloseWait)
	defer cancel()
	// The executor closes drained once nothing of the region is in
	// flight; closing the group also answers every job.
	if err := r.g.do(ctx, func() { r.g.closing(r) }); err == nil {
		select {
		case <-r.drained:
		case <-ctx.Done():
		}
	}
	r.svc.forget(r)
	select {
	case <-r.drained:
	default:
		r.svc.cfg.Logger.Error("region closed with transfers still in flight: it stays mapped so that they write valid memory", "region", r.id, "namespace", r.g.name)
		return fmt.Errorf("region %s: transfers still in flight after %v", r.id, r.svc.cfg.CloseWait)
	}
	if err := r.m.unmap(); err != nil {
		return fmt.Errorf("region %s: unmap: %w", r.id, err)
	}
	r.svc.cfg.Logger.Info("region closed", "region", r.id, "namespace", r.g.name)
	return nil
}
