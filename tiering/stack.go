package tiering

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/kvtier/kvtier/offload"
)

// Driver is what a Stack needs from whoever drives it: the primary-backed
// Manager, or the region service that runs the stack over an engine's
// arena (vLLM tier mode). The Stack calls it from the driving goroutine
// only.
type Driver interface {
	// PinCascade pins keys for the first job of a cascade and returns the
	// keys it pinned, in order (those still readable: a block may have
	// gone since the caller saw it), and their slots. No keys means
	// nothing to cascade.
	PinCascade(keys []offload.Key) ([]offload.Key, []int64, error)
	// PinAgain takes one more pin on slots for another job of the same
	// cascade.
	PinAgain(slots []int64) error
	// CascadeDone releases the pins of one cascade job. It is called
	// exactly once for every job PinCascade or PinAgain pinned, whatever
	// its outcome, except for the jobs Forget drops.
	CascadeDone(j *offload.Job)
	// PromotionDone resolves a promotion's target slots: the keys of
	// loaded (a subsequence of j.Keys, all of them on success) arrived,
	// the others did not. It is called exactly once per promotion
	// submitted with Load.
	PromotionDone(j *offload.Job, loaded []offload.Key)
}

// BlockReleaser is implemented by the driver of a revocable stack: Revoke
// gives back, one block at a time, the pins of cascade jobs whose tiers
// claim blocks (offload.BlockClaimer).
type BlockReleaser interface {
	// ReleaseBlock releases one pin on slot per entry of slots (each
	// entry a pin PinCascade or PinAgain took for a job still in flight);
	// the job's CascadeDone then leaves those slots out.
	ReleaseBlock(slots []int64)
}

// StackConfig configures a Stack.
type StackConfig struct {
	// Tiers are the secondary tiers in lookup priority order. The stack
	// owns them after NewStack and closes them in Close.
	Tiers []offload.SecondaryTier
	// Arena is the slot memory every job transfers into or out of.
	Arena offload.Arena
	// Driver pins cascade sources and resolves job outcomes.
	Driver Driver
	// Logger receives warnings and back-pressure transitions; nil discards.
	Logger *slog.Logger
	// Admission configures back-pressure; the zero value means defaults.
	Admission AdmissionConfig
	// Budget bounds the arena slots cascades in flight may pin, as a share
	// of Arena.NumSlots(); the zero value means defaults.
	Budget BudgetConfig
	// Revocable says the driver's cascade pins may be revoked (soft pins
	// of the primary): Revoke then withdraws the queued cascades reading a
	// slot, and takes single blocks back from the jobs of tiers that
	// claim blocks. The driver must implement BlockReleaser.
	Revocable bool
	// Owners, if set, divides the pin budget between the blocks' owners
	// (tenants).
	Owners Owners
}

// Stack is an ordered stack of secondary tiers working on (key, slot)
// pairs of one arena: the mechanism both the primary-backed Manager and
// vLLM tier mode drive. It enforces each request's filters (a tier the
// load filter excludes is never asked, one the store filter excludes
// never receives a cascade), gives every job a unique id and exactly one
// outcome, recovers tiers that panic, and admits cascades against
// back-pressure, the pin budget and the tiers' queues. See the package
// documentation for the invariants.
//
// A Stack is single-executor, like the Manager.
type Stack struct {
	drv   Driver
	arena offload.Arena
	tiers []*tier
	log   *slog.Logger
	adm   AdmissionConfig

	// maxPinned and tierMaxPinned are the budget in slots (0: unbounded);
	// pinned counts the slots of the cascades in flight, once per cascade.
	maxPinned, tierMaxPinned int
	// ownerOf, ownerMax and ownerPinned divide the budget between the
	// blocks' owners (StackConfig.Owners); nil without owners.
	ownerOf     func(offload.Key) int
	ownerMax    []int
	ownerPinned []int
	pinned      int
	// dq holds the cascades the budget could not take yet.
	dq deferQueue

	// nextID is the job id counter shared by promotions and cascades.
	// groups holds the cascades in flight, free its unused entries; jobs
	// and bySlot name a cascade by its index + 1 (a gid), which keeps
	// pointers out of the per-slot index: no write barrier when it
	// changes, nothing for the collector to scan.
	groups []cascadeGroup
	free   []int32
	// bySlot is the cascade reading each slot (the latest, if several) and
	// readers the number of cascades reading it, for Revoke; nil unless
	// the stack is revocable.
	bySlot  []int32
	readers []uint16
	// releaser is the driver when the stack is revocable and a tier
	// claims blocks (nil otherwise: cascades get no Claims); release is
	// its scratch.
	releaser BlockReleaser
	release  []int64

	nextID uint64
	// resetFloor is the first job id issued after the last Forget; results
	// for unknown older ids are stale, not tier bugs.
	resetFloor   uint64
	jobs         map[uint64]*job
	staleResults uint64
	closed       bool
	// finishedAt is the time Poll collected the results it is applying
	// (zero until first needed, and outside Poll).
	finishedAt time.Time
	// epoch is the stack's creation time, the origin of job start times.
	epoch time.Time
}

// tier is the stack's view of one secondary tier.
type tier struct {
	t        offload.SecondaryTier
	queue    offload.JobQueue // nil unless the tier queues jobs
	readOnly bool             // offload.ReadOnly: never cascaded to
	claims   bool             // offload.BlockClaimer: blocks revocable one by one
	idx      int
	name     string
	typ      string
	medium   offload.Medium
	locality offload.Locality

	cascadesInFlight int
	// pinned counts the slots this tier's cascades in flight read.
	pinned   int
	pressure pressure
	// warnedAt and quiet rate-limit the tier's failure warnings.
	warnedAt    time.Time
	quiet       int
	stats       TierStats
	load, store histogram
}

// NewStack builds a stack over cfg.Tiers.
func NewStack(cfg StackConfig) (*Stack, error) {
	if len(cfg.Tiers) > MaxTiers {
		return nil, fmt.Errorf("tiering: %d secondary tiers: at most %d supported", len(cfg.Tiers), MaxTiers)
	}
	if cfg.Driver == nil {
		return nil, errors.New("tiering: stack without a driver")
	}
	adm, err := cfg.Admission.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := cfg.Budget.validate(); err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Stack{
		drv:   cfg.Driver,
		arena: cfg.Arena,
		log:   log,
		adm:   adm,
		epoch: time.Now(),
		jobs:  make(map[uint64]*job),
	}
	slots := 0
	if cfg.Arena != nil {
		slots = cfg.Arena.NumSlots()
	}
	writable := 0
	for _, t := range cfg.Tiers {
		if ro, ok := t.(offload.ReadOnly); !ok || !ro.ReadOnly() {
			writable++
		}
	}
	s.maxPinned, s.tierMaxPinned = cfg.Budget.limits(slots, writable)
	if s.maxPinned > 0 && cfg.Budget.MaxDeferred >= 0 {
		s.dq.max = cfg.Budget.MaxDeferred
		if s.dq.max == 0 {
			s.dq.max = slots
		}
	}
	if s.ownerMax = cfg.Owners.limits(s.maxPinned); s.ownerMax != nil {
		s.ownerOf = cfg.Owners.Of
		s.ownerPinned = make([]int, len(s.ownerMax))
	}
	if cfg.Revocable && len(cfg.Tiers) > 0 {
		s.bySlot = make([]int32, slots)
		s.readers = make([]uint16, slots)
	}
	names := make(map[string]bool, len(cfg.Tiers))
	for i, t := range cfg.Tiers {
		if t == nil {
			return nil, fmt.Errorf("tiering: secondary tier #%d is nil", i)
		}
		ts := &tier{t: t, idx: i}
		// A tier's declarations are read once, here: the lookup loop then
		// tests the request's filter without calling into the tier.
		if err := s.describe(ts); err != nil {
			return nil, err
		}
		if names[ts.name] {
			return nil, fmt.Errorf("tiering: duplicate secondary tier name %q", ts.name)
		}
		names[ts.name] = true
		ts.queue, _ = t.(offload.JobQueue)
		if ro, ok := t.(offload.ReadOnly); ok {
			ts.readOnly = ro.ReadOnly()
		}
		if c, ok := t.(offload.BlockClaimer); ok && c.ClaimsBlocks() && s.bySlot != nil {
			ts.claims = true
			if s.releaser, ok = cfg.Driver.(BlockReleaser); !ok {
				return nil, errors.New("tiering: a revocable stack's driver must implement BlockReleaser")
			}
		}
		ts.stats.Name, ts.stats.Type = ts.name, ts.typ
		ts.stats.Medium, ts.stats.Locality = ts.medium, ts.locality
		s.tiers = append(s.tiers, ts)
	}
	return s, nil
}

// describe reads a tier's static declarations, failing construction if
// the tier panics.
func (s *Stack) describe(ts *tier) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("tiering: secondary tier #%d: describing it panicked: %v", ts.idx, p)
		}
	}()
	ts.name, ts.typ = ts.t.Name(), ts.t.Type()
	ts.medium, ts.locality = ts.t.Medium(), ts.t.Locality()
	return nil
}

// Len returns the number of tiers.
func (s *Stack) Len() int { return len(s.tiers) }

// Tiers returns the secondary tiers in lookup order.
func (s *Stack) Tiers() []offload.SecondaryTier {
	out := make([]offload.SecondaryTier, len(s.tiers))
	for i, ts := range s.tiers {
		out[i] = ts.t
	}
	return out
}

// warnEvery bounds how often one tier's failures are logged: a failing
// disk fails every cascade, and the log must say so without flooding.
const warnEvery = 10 * time.Second

// OnNewRequest tells every tier about req and returns the tiers (a bit
// per index) that asked for request-level stores and that req's store
// filter allows: a request-level tier the request may not store to gains
// nothing from prefix hits being offered again.
func (s *Stack) OnNewRequest(req *offload.ReqContext) (requestLevel uint64) {
	for _, ts := range s.tiers {
		if s.tierOnNewRequest(ts, req) == offload.RequestLevel && req.StoreFilter.Allows(ts.medium, ts.locality) {
			requestLevel |= 1 << ts.idx
		}
	}
	return requestLevel
}

// OnRequestFinished tells every tier that req finished. Its cascades
// still waiting for the budget go on under a context of their own.
func (s *Stack) OnRequestFinished(req *offload.ReqContext) {
	s.detachDeferred(req)
	for _, ts := range s.tiers {
		s.tierOnRequestFinished(ts, req)
	}
}

// Touch refreshes recency in every tier (not filtered: recency is not a
// load).
func (s *Stack) Touch(keys []offload.Key, req *offload.ReqContext) {
	for _, ts := range s.tiers {
		s.tierTouch(ts, keys, req)
	}
}

// ScheduleEnd lets every tier end its step.
func (s *Stack) ScheduleEnd(se offload.ScheduleEnd) {
	for _, ts := range s.tiers {
		s.tierScheduleEnd(ts, se)
	}
}

// TakeEvents appends each tier's events, in order, to ev.
func (s *Stack) TakeEvents(ev []offload.Event) []offload.Event {
	for _, ts := range s.tiers {
		ev = append(ev, s.tierTakeEvents(ts)...)
	}
	return ev
}

// InFlight reports submitted jobs without an outcome yet.
func (s *Stack) InFlight() int { return len(s.jobs) }

// HasPendingWork reports jobs in flight or tier work in flight.
func (s *Stack) HasPendingWork() bool {
	if len(s.jobs) > 0 {
		return true
	}
	if s.closed {
		return false
	}
	for _, ts := range s.tiers {
		if s.tierHasPendingWork(ts) {
			return true
		}
	}
	return false
}

// Drain waits (bounded by ctx) until no tier transfer touches the arena.
// If a tier cannot be drained the error says which. The deferred cascades
// are dropped first: they would start transfers after it (its callers
// reset or close what the arena holds).
func (s *Stack) Drain(ctx context.Context) error {
	s.dropDeferred()
	for _, ts := range s.tiers {
		if err := s.tierDrain(ctx, ts); err != nil {
			return fmt.Errorf("drain tier %q: %w", ts.name, err)
		}
	}
	return nil
}

// Forget fails the jobs still without an outcome after a Drain (the
// tiers said they were drained but did not answer them): the driver gets
// their outcome now, and their late results are ignored as stale.
func (s *Stack) Forget() {
	if len(s.jobs) > 0 {
		s.log.Error("tiering: reset: jobs unanswered after drain; failing them", "jobs", len(s.jobs))
		for id, jb := range s.jobs {
			delete(s.jobs, id)
			s.finishJob(jb, offload.JobResult{JobID: id, Err: errors.New("unanswered after drain")})
		}
	}
	s.resetFloor = s.nextID
	// The reset drops the blocks the deferred cascades name.
	s.dropDeferred()
}

// Close closes every tier (answering its outstanding jobs), applies their
// results and fails the jobs a tier did not answer. If a tier cannot be
// closed within ctx its transfers may still touch the arena; the error
// says which.
func (s *Stack) Close(ctx context.Context) error {
	if s.closed {
		return nil
	}
	s.dropDeferred()
	var errs []error
	for _, ts := range s.tiers {
		if err := s.tierClose(ctx, ts); err != nil {
			errs = append(errs, fmt.Errorf("tiering: close tier %q: %w", ts.name, err))
		}
	}
	s.Poll()
	for id, jb := range s.jobs {
		delete(s.jobs, id)
		s.finishJob(jb, offload.JobResult{JobID: id, Err: ErrClosed})
	}
	s.closed = true
	return errors.Join(errs...)
}

// Stats returns a snapshot of each tier's counters and gauges.
func (s *Stack) Stats() []TierStats {
	out := make([]TierStats, len(s.tiers))
	for i, ts := range s.tiers {
		t := ts.stats
		t.UnderPressure = ts.pressure.active
		t.CascadeLatencyEMA = time.Duration(ts.pressure.ema * float64(time.Second))
		t.CascadesInFlight = ts.cascadesInFlight
		t.PinnedSlots = ts.pinned
		t.PinBudget = s.tierMaxPinned
		if ts.queue != nil && !s.closed {
			t.Queued, t.QueueCapacity = s.tierQueued(ts)
		}
		t.LoadLatency, t.StoreLatency = ts.load.snapshot(), ts.store.snapshot()
		out[i] = t
	}
	return out
}
