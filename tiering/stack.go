package tiering

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"slices"
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
	pinned                   int

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

// job is one submitted transfer.
type job struct {
	tier  *tier
	start time.Duration // submission time, since the stack's epoch (8 bytes, not 24)
	// gid names the cascade the job belongs to (0 for promotions).
	gid int32
	// released counts the blocks Revoke took back from this job (their
	// pins already released); they are the blocks j.Claims reports
	// revoked.
	released int32
	j        offload.Job
}

// cascadeGroup is the state the jobs of one cascade share. It holds no
// pointer: the cascade's jobs have the consecutive ids first, first+1,
// …, first+n-1 (Cascade issues no other id while it submits them).
type cascadeGroup struct {
	first uint64
	n     int32 // jobs submitted
	jobs  int32 // jobs without an outcome yet
	slots int32 // slots counted against the budget
	open  bool  // Cascade is still submitting its jobs
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

// PromotionSource returns the name of the tier a promotion job in flight
// is loading key from. It scans the jobs: for tools, not the hot path.
func (s *Stack) PromotionSource(key offload.Key) (string, bool) {
	for _, j := range s.jobs {
		if j.gid == 0 && j.j.Promotion && slices.Contains(j.j.Keys, key) {
			return j.tier.name, true
		}
	}
	return "", false
}

// Tiers returns the secondary tiers in lookup order.
func (s *Stack) Tiers() []offload.SecondaryTier {
	out := make([]offload.SecondaryTier, len(s.tiers))
	for i, ts := range s.tiers {
		out[i] = ts.t
	}
	return out
}

// Lookup asks each tier req's load filter allows, in order, whether it
// holds key; a tier the filter excludes is not called. It returns Hit and
// the index of the first tier that holds key, Retry when no tier holds it
// but one is not sure yet, or Miss (index -1 for both).
//
// A tier's miss is counted only when the answer is final (Hit or Miss): while
// another tier is not sure yet the key is asked again, and a tier that
// missed each time would count one miss per ask.
func (s *Stack) Lookup(key offload.Key, req *offload.ReqContext) (offload.LookupResult, int) {
	filter := req.LoadFilter
	retry := false
	var missed uint64 // tiers (by index, the first 64) that answered Miss
	for _, ts := range s.tiers {
		if !filter.Allows(ts.medium, ts.locality) {
			ts.stats.SkippedByFilter++
			continue
		}
		switch s.tierLookup(ts, key, req) {
		case offload.Hit:
			ts.stats.Hits++
			s.countMisses(missed)
			return offload.Hit, ts.idx
		case offload.Retry, offload.HitPending:
			// A tier has no pending state of its own to report; treat
			// HitPending as "not sure yet".
			ts.stats.Retries++
			retry = true
		default:
			if ts.idx < 64 {
				missed |= 1 << ts.idx
			} else {
				ts.stats.Misses++
			}
		}
	}
	if retry {
		return offload.Retry, -1
	}
	s.countMisses(missed)
	return offload.Miss, -1
}

// countMisses counts a miss for each tier of the mask (by index).
func (s *Stack) countMisses(mask uint64) {
	for ; mask != 0; mask &= mask - 1 {
		s.tiers[bits.TrailingZeros64(mask)].stats.Misses++
	}
}

// Load submits a promotion of keys from tier i into slots (co-indexed),
// which the driver has reserved, and returns its job id. Its outcome
// reaches Driver.PromotionDone.
func (s *Stack) Load(i int, keys []offload.Key, slots []int64, req *offload.ReqContext) uint64 {
	return s.LoadInto(s.arena, i, keys, slots, req)
}

// LoadInto is Load into the slots of arena a instead of the stack's
// arena: in tier mode each engine's jobs address its own region.
func (s *Stack) LoadInto(a offload.Arena, i int, keys []offload.Key, slots []int64, req *offload.ReqContext) uint64 {
	ts := s.tiers[i]
	jb := s.initJob(new(job), ts, keys, slots, true, req, time.Now())
	jb.j.Arena = a
	if !s.tierSubmit(ts, &jb.j) {
		s.failSubmitted(jb, "submit load panicked")
	}
	return jb.j.ID
}

// Cascade submits a store of keys (owned by the jobs from now on) to
// every tier in mask that req's store filter allows and admission
// accepts, pinning the source blocks once per job through the driver.
// Only the first job resolves the keys (PinCascade); the others pin the
// same slots (PinAgain). The jobs share keys and slots, which tiers only
// read. It returns the number of jobs submitted; each one's outcome
// reaches Driver.CascadeDone.
func (s *Stack) Cascade(keys []offload.Key, req *offload.ReqContext, mask uint64) int {
	_, n := s.CascadeFrom(s.arena, keys, req, mask)
	return n
}

// CascadeFrom is Cascade out of the slots of arena a instead of the
// stack's arena. It also returns the id of the cascade's first job: its n
// jobs have the ids first, first+1, …, first+n-1, so that a driver can
// tell which cascade a CascadeDone belongs to even when it arrives during
// the call (a submission that panicked).
func (s *Stack) CascadeFrom(a offload.Arena, keys []offload.Key, req *offload.ReqContext, mask uint64) (first uint64, n int) {
	first = s.nextID
	filter := req.StoreFilter
	var now time.Time
	var slots []int64
	var block []job // the cascade's jobs, one allocation
	var gid int32
	var claims offload.Claims
	for _, ts := range s.tiers {
		if mask&(1<<ts.idx) == 0 || ts.readOnly {
			continue
		}
		if !filter.Allows(ts.medium, ts.locality) {
			ts.stats.CascadesSkippedByFilter++
			continue
		}
		if s.maxPinned > 0 || ts.queue != nil || ts.pressure.active {
			if r, drop := s.admit(ts, len(keys), gid == 0 || s.groups[gid-1].jobs == 0); drop {
				s.countDrop(ts, r, len(keys))
				continue
			}
		}
		if slots != nil {
			// The blocks are pinned by the first job, so the slots still
			// name them.
			if err := s.drv.PinAgain(slots); err != nil {
				s.log.Error("tiering: cannot pin cascade source blocks", "tier", ts.name, "req", req.ID, "err", err)
				ts.stats.CascadesFailed++
				continue
			}
		} else {
			var err error
			var pinned []offload.Key
			pinned, slots, err = s.drv.PinCascade(keys)
			if err != nil {
				s.log.Error("tiering: cannot pin cascade source blocks", "tier", ts.name, "req", req.ID, "err", err)
				ts.stats.CascadesFailed++
				slots = nil
				continue
			}
			if len(pinned) == 0 {
				return first, n
			}
			keys = pinned
		}
		if now.IsZero() {
			now = time.Now()
			block = make([]job, 0, len(s.tiers)-ts.idx)
		}
		block = block[:len(block)+1] // within capacity: one job per tier left
		jb := s.initJob(&block[len(block)-1], ts, keys, slots, false, req, now)
		jb.j.Arena = a
		if gid == 0 {
			gid = s.newGroup(int32(len(keys)), jb.j.ID)
			if s.releaser != nil {
				claims = offload.NewClaims(len(keys))
			}
		}
		// Every job of the cascade carries its claims, so that the last
		// one to end knows which blocks Revoke took back.
		jb.j.Claims = claims
		g := &s.groups[gid-1]
		g.n++
		if g.jobs == 0 {
			// The cascade counts against the budget, and is indexed for
			// Revoke, while it has a job (one whose submission panicked
			// has already ended).
			s.pinned += int(g.slots)
			if s.bySlot != nil {
				for _, sl := range slots {
					s.bySlot[sl] = gid
					s.readers[sl]++
				}
			}
		}
		jb.gid = gid
		g.jobs++
		ts.pinned += len(keys)
		ts.cascadesInFlight++
		n++
		if !s.tierSubmit(ts, &jb.j) {
			s.failSubmitted(jb, "submit store panicked")
		}
	}
	if gid != 0 {
		g := &s.groups[gid-1]
		if g.open = false; g.jobs == 0 {
			s.freeGroup(gid)
		}
	}
	return first, n
}

// freeGroup returns a cascade's entry to the free list.
func (s *Stack) freeGroup(gid int32) {
	s.groups[gid-1] = cascadeGroup{}
	s.free = append(s.free, gid-1)
}

// newGroup takes a free cascade entry and returns its gid; it stays open
// (not freed when its jobs end) until Cascade has submitted them all.
func (s *Stack) newGroup(slots int32, first uint64) int32 {
	var i int32
	if n := len(s.free); n > 0 {
		i = s.free[n-1]
		s.free = s.free[:n-1]
	} else {
		s.groups = append(s.groups, cascadeGroup{})
		i = int32(len(s.groups) - 1)
	}
	s.groups[i] = cascadeGroup{slots: slots, first: first, open: true}
	return i + 1
}

// admit decides whether ts takes a cascade of n blocks; first is true
// while the cascade has no job yet (its blocks are not yet counted
// against the budget).
func (s *Stack) admit(ts *tier, n int, first bool) (DropReason, bool) {
	if !s.adm.Disabled && ts.pressure.active && ts.cascadesInFlight > 0 {
		return DropPressure, true
	}
	if s.maxPinned > 0 {
		// With nothing in flight one cascade is admitted whatever its
		// size, so that a batch larger than the budget still cascades.
		if first && s.pinned > 0 && s.pinned+n > s.maxPinned {
			return DropBudget, true
		}
		if ts.pinned > 0 && ts.pinned+n > s.tierMaxPinned {
			return DropTierBudget, true
		}
	}
	if ts.queue != nil {
		if q, c := s.tierQueued(ts); c > 0 && q >= c {
			return DropQueueFull, true
		}
	}
	return 0, false
}

func (s *Stack) countDrop(ts *tier, r DropReason, blocks int) {
	ts.stats.CascadesDropped++
	ts.stats.CascadeBlocksDropped += uint64(blocks)
	ts.stats.DroppedBy[r]++
}

// initJob fills jb as a new job and registers it.
func (s *Stack) initJob(jb *job, ts *tier, keys []offload.Key, slots []int64, promotion bool, req *offload.ReqContext, now time.Time) *job {
	id := s.nextID
	s.nextID++
	*jb = job{tier: ts, start: now.Sub(s.epoch), j: offload.Job{ID: id, Keys: keys, Slots: slots, Promotion: promotion, Req: req, Arena: s.arena}}
	s.jobs[id] = jb
	return jb
}

// failSubmitted resolves a job whose submission panicked: the tier is
// assumed not to have taken it.
func (s *Stack) failSubmitted(jb *job, why string) {
	if _, ok := s.jobs[jb.j.ID]; !ok {
		return
	}
	delete(s.jobs, jb.j.ID)
	s.finishJob(jb, offload.JobResult{JobID: jb.j.ID, Err: errors.New(why)})
}

// Poll collects every tier's finished jobs, in tier order, and applies
// them.
func (s *Stack) Poll() {
	// The results were all collected now: one clock read dates them.
	s.finishedAt = time.Time{}
	defer func() { s.finishedAt = time.Time{} }()
	for _, ts := range s.tiers {
		for _, r := range s.tierFinished(ts) {
			jb, ok := s.jobs[r.JobID]
			if !ok || jb.tier != ts {
				if !ok && r.JobID < s.resetFloor {
					s.staleResults++
					continue
				}
				ts.stats.UnknownJobs++
				s.log.Error("tiering: tier reported a job it was not given", "tier", ts.name, "job", r.JobID)
				continue
			}
			delete(s.jobs, r.JobID)
			s.finishJob(jb, r)
		}
	}
}

// latency is the time from a job's submission to its result: the
// duration the tier reports (which runs from its Submit call), or the
// time until the result was collected.
func (s *Stack) latency(jb *job, r offload.JobResult) time.Duration {
	if r.Duration > 0 {
		return r.Duration
	}
	if s.finishedAt.IsZero() {
		s.finishedAt = time.Now()
	}
	return s.finishedAt.Sub(s.epoch) - jb.start
}

// finishJob applies a job's result: counts it and hands it to the driver.
func (s *Stack) finishJob(jb *job, r offload.JobResult) {
	ts := jb.tier
	keys := jb.j.Keys
	if jb.j.Promotion {
		ts.load.observe(s.latency(jb, r))
		loaded := keys
		if !r.Success {
			loaded = Subsequence(keys, r.SuccessfulKeys)
			ts.stats.PromotionsFailed++
			ts.stats.PromotionBlocksFailed += uint64(len(keys) - len(loaded))
			s.warn(ts, "tiering: promotion failed", "job", r.JobID, "keys", len(keys), "loaded", len(loaded), "err", r.Err)
		} else {
			ts.stats.PromotionsOK++
		}
		ts.stats.PromotedBlocks += uint64(len(loaded))
		ts.stats.BytesIn += uint64(max(r.Bytes, 0))
		s.drv.PromotionDone(&jb.j, loaded)
		return
	}
	s.endCascade(jb)
	if !r.Success {
		if reason, ok := offload.RefusalReason(r.Err); ok {
			dr := DropQueueFull
			if reason == offload.RefusedTierDown {
				dr = DropTierDown
			}
			s.countDrop(ts, dr, len(keys))
			return
		}
		ts.store.observe(s.latency(jb, r))
		ts.stats.CascadesFailed++
		// Disk full, EIO, a server error: the operator must see these.
		s.warn(ts, "tiering: cascade failed", "job", r.JobID, "blocks", len(keys), "err", r.Err)
		return
	}
	d := s.latency(jb, r)
	ts.store.observe(d)
	ts.stats.CascadesOK++
	// Blocks the tier refused (their cluster node down) stay in the
	// primary only, like a dropped cascade's; one both refused and
	// revoked since is subtracted once.
	refused := min(max(r.Refused, 0), len(keys)-int(jb.released))
	ts.stats.CascadedBlocks += uint64(len(keys) - int(jb.released) - refused)
	ts.stats.CascadeBlocksDropped += uint64(refused)
	ts.stats.BytesOut += uint64(max(r.Bytes, 0))
	if s.adm.Disabled {
		return
	}
	if ts.pressure.sample(d, &s.adm) {
		state := "cleared"
		if ts.pressure.active {
			state = "activated"
		}
		s.log.Info("tiering: tier back-pressure "+state, "tier", ts.name, "index", ts.idx,
			"ema", time.Duration(ts.pressure.ema*float64(time.Second)))
	}
}

// Subsequence returns the keys of keys that appear, in order, in of: the
// loaded keys of a partial load whose SuccessfulKeys may be any
// subsequence of the job's keys (extras, or keys out of order, a tier
// must not report, are ignored).
func Subsequence(keys, of []offload.Key) []offload.Key {
	if len(of) == 0 {
		return nil
	}
	out := make([]offload.Key, 0, len(of))
	j := 0
	for _, k := range keys {
		if j < len(of) && of[j] == k {
			out = append(out, k)
			j++
		}
	}
	return out
}

// warnEvery bounds how often one tier's failures are logged: a failing
// disk fails every cascade, and the log must say so without flooding.
const warnEvery = 10 * time.Second

// warn logs a tier failure at warning level, at most once per warnEvery
// per tier, with the count of those it kept quiet since.
func (s *Stack) warn(ts *tier, msg string, args ...any) {
	now := time.Now()
	if now.Sub(ts.warnedAt) < warnEvery {
		ts.quiet++
		return
	}
	if ts.quiet > 0 {
		args = append(args, "similar_since_last", ts.quiet)
	}
	ts.warnedAt, ts.quiet = now, 0
	s.log.Warn(msg, append([]any{"tier", ts.name}, args...)...)
}

// endCascade releases what a cascade job held: its pins (through the
// driver), its share of the budget and its in-flight count.
func (s *Stack) endCascade(jb *job) {
	ts := jb.tier
	ts.cascadesInFlight--
	ts.pinned -= len(jb.j.Keys) - int(jb.released)
	claims := jb.j.Claims
	g := &s.groups[jb.gid-1]
	if g.jobs--; g.jobs == 0 {
		s.pinned -= int(g.slots)
		if s.bySlot != nil {
			for i, sl := range jb.j.Slots {
				if claims != nil && claims.Revoked(i) {
					continue // unindexed when Revoke took it back
				}
				s.readers[sl]--
				if s.bySlot[sl] == jb.gid {
					s.bySlot[sl] = 0
				}
			}
		}
		if !g.open {
			s.freeGroup(jb.gid)
		}
	}
	if jb.released == 0 {
		s.drv.CascadeDone(&jb.j)
		return
	}
	// The pins of the blocks Revoke took back are released already.
	j := jb.j
	j.Keys = make([]offload.Key, 0, len(j.Keys)-int(jb.released))
	j.Slots = make([]int64, 0, cap(j.Keys))
	for i, sl := range jb.j.Slots {
		if !claims.Revoked(i) {
			j.Keys, j.Slots = append(j.Keys, jb.j.Keys[i]), append(j.Slots, sl)
		}
	}
	s.drv.CascadeDone(&j)
}

// Revoke releases the cascades' pins on slot, if it can do so without
// tearing a transfer. For each cascade reading the slot, the jobs of
// tiers that claim blocks (offload.BlockClaimer) give that one block back
// unless a tier is reading it at this moment (they go on with their other
// blocks); the other jobs are withdrawn whole if still queued in their
// tier (offload.JobQueue), counted as dropped (DropCancelled). It reports
// false, leaving the cascade's pins in place, when a job that does not
// claim blocks has started or its tier cannot withdraw it, or a tier is
// reading the block; jobs withdrawn by then stay withdrawn. The primary
// calls it (through the driver) when eviction reaches a block held by
// cascades only, so that cascades never keep a block the primary alone
// would have evicted.
func (s *Stack) Revoke(slot int64) bool {
	if s.bySlot == nil || slot < 0 || slot >= int64(len(s.bySlot)) {
		return false
	}
	if gid := s.bySlot[slot]; gid != 0 && !s.withdraw(gid, slot) {
		return false
	}
	if s.readers[slot] == 0 {
		return true
	}
	// Several cascades read the slot (a request-level tier was offered
	// blocks again): the index names only the latest, so look for the
	// others among the jobs in flight. This is rare and off the hot path.
	var others []int32
	for _, jb := range s.jobs {
		if jb.gid != 0 && !slices.Contains(others, jb.gid) && slices.Contains(jb.j.Slots, slot) {
			others = append(others, jb.gid)
		}
	}
	for _, gid := range others {
		if !s.withdraw(gid, slot) {
			return false
		}
	}
	return true
}

// withdraw releases cascade gid's pins on slot (see Revoke) and reports
// whether none is left.
func (s *Stack) withdraw(gid int32, slot int64) bool {
	// The entry may be freed as its last job ends: copy what is needed.
	g := s.groups[gid-1]
	var claims offload.Claims
	for id := g.first; id < g.first+uint64(g.n); id++ {
		jb, live := s.jobs[id]
		switch {
		case !live:
		case jb.tier.claims:
			claims = jb.j.Claims
		case jb.tier.queue == nil:
			return false
		}
	}
	all := true
	for id := g.first; id < g.first+uint64(g.n); id++ {
		jb, live := s.jobs[id]
		if !live || jb.tier.claims {
			continue // answered, failed at submission, or given back per block
		}
		if !s.tierCancel(jb.tier, jb.j.ID) {
			all = false
			continue
		}
		delete(s.jobs, jb.j.ID)
		s.countDrop(jb.tier, DropCancelled, len(jb.j.Keys))
		s.endCascade(jb)
	}
	if !all || claims == nil {
		return all
	}
	return s.takeBack(gid, claims, slot)
}

// takeBack takes the block in slot back from the jobs of cascade gid,
// all of them of tiers that claim blocks, unless a tier is reading it:
// each job's pin is released, the block no longer counts against the
// budget nor names the cascade in the index.
func (s *Stack) takeBack(gid int32, claims offload.Claims, slot int64) bool {
	g := &s.groups[gid-1]
	var i int
	s.release = s.release[:0]
	for id := g.first; id < g.first+uint64(g.n); id++ {
		jb, live := s.jobs[id]
		if !live {
			continue
		}
		if len(s.release) == 0 {
			if i = slices.Index(jb.j.Slots, slot); i < 0 || claims.Revoked(i) {
				return true // taken back before (the slot holds another block now)
			}
			if !claims.Revoke(i) {
				return false // a tier is reading it
			}
		}
		s.release = append(s.release, slot)
		jb.released++
		jb.tier.pinned--
		jb.tier.stats.CascadeBlocksRevoked++
	}
	if len(s.release) == 0 {
		return true
	}
	s.releaser.ReleaseBlock(s.release)
	g.slots--
	s.pinned--
	s.readers[slot]--
	if s.bySlot[slot] == gid {
		s.bySlot[slot] = 0
	}
	return true
}

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

// OnRequestFinished tells every tier that req finished.
func (s *Stack) OnRequestFinished(req *offload.ReqContext) {
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
// If a tier cannot be drained the error says which.
func (s *Stack) Drain(ctx context.Context) error {
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
}

// Close closes every tier (answering its outstanding jobs), applies their
// results and fails the jobs a tier did not answer. If a tier cannot be
// closed within ctx its transfers may still touch the arena; the error
// says which.
func (s *Stack) Close(ctx context.Context) error {
	if s.closed {
		return nil
	}
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

// Pinned returns the slots the cascades in flight pin (once per cascade)
// and the budget in slots (0: unbounded).
func (s *Stack) Pinned() (pinned, budget int) { return s.pinned, s.maxPinned }

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
