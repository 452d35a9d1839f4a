package memory

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/quota"
)

// Type is the configured type of memory tiers.
const Type = "memory"

// Errors reported in failed JobResults.
var (
	// ErrClosed fails jobs submitted to, or still waiting in, a closed tier.
	ErrClosed = errors.New("memory tier: closed")
	// ErrNotPresent fails a load of a block the tier does not hold.
	ErrNotPresent = errors.New("memory tier: block not present")
	// ErrInjected is the failure produced by Config.FailRate.
	ErrInjected = errors.New("memory tier: injected failure")
	// ErrFull fails the store of a block whose tenant's share leaves no
	// room: every other tenant is within its quota (shares.go).
	ErrFull = errors.New("memory tier: full for this tenant")
)

// Config configures a memory tier.
type Config struct {
	Name           string
	Medium         offload.Medium   // unspecified = dynamic
	Locality       offload.Locality // unspecified = dynamic
	CapacityBlocks int              // 0 = unbounded; LRU eviction with removed events otherwise
	Latency        time.Duration    // simulated per-job latency (jobs complete on a goroutine)
	BlockLatency   time.Duration    // simulated latency per block of a job, added to Latency
	// Concurrency bounds the jobs in service at once (0: unbounded); the
	// others wait in a FIFO queue, which a slow device has too. QueueDepth
	// bounds that queue (0: unbounded); a job beyond it is refused
	// (offload.RefusedQueueFull).
	Concurrency int
	QueueDepth  int
	FailRate    float64 // 0..1 probability that a job fails (failure injection)
	AsyncLookup bool    // first lookup answers Retry; resolved at OnScheduleEnd
	Events      bool    // emit stored/removed events
	Seed        int64   // deterministic failure injection
	// Shares divide CapacityBlocks between tenants (shares.go); set from
	// the daemon's tenants' quota.tiers, not from the tier's own entry.
	// Their quotas are in bytes, rounded down to whole blocks of
	// BlockBytes, the size of the blocks the tier holds (required with
	// Shares).
	Shares     []quota.Share
	BlockBytes int
}

// Tier is an in-process secondary tier. It implements
// offload.SecondaryTier. Like every tier it is driven by one executor
// goroutine; its own goroutines only complete delayed jobs, so all shared
// state sits behind one mutex.
type Tier struct {
	cfg     Config
	closing chan struct{} // closed by Close: delayed jobs give up waiting

	// rng decides injected failures at submit time, on the executor, so a
	// seed reproduces the same failures whatever the goroutine schedule.
	rng *rand.Rand

	mu     sync.Mutex
	blocks map[offload.Key]*entry
	// lrus are the sentinels of the recency lists, one per owner of
	// the shares (one without shares); lru.next is the oldest.
	lrus []entry
	sh   *shares // nil without tenants' shares
	// keep reports blocks eviction passes over (routers' pins:
	// offload.Keeper); nil keeps none.
	keep func(offload.Key) bool
	// exhausted is evict's scratch, one flag per owner (nil without
	// shares).
	exhausted []bool
	spare     []*entry // evicted entries, recycled with their buffers
	reqs      map[string]*reqState
	// asking are the requests with lookups queued for the step end, so
	// that neither it nor HasPendingWork walks every request.
	asking   map[*reqState]struct{}
	nmissed  int // keys marked missed across all requests
	results  []offload.JobResult
	events   []offload.Event
	evicted  uint64 // blocks evicted to make room
	inflight int    // jobs without a result: in service or waiting
	running  int    // jobs in service (waiting out their latency)
	waiting  []waitingJob
	// serving holds the jobs in service; a job's transfer happens when
	// its latency has passed, so until then it can still be withdrawn.
	serving map[uint64]chan struct{}
	idle    chan struct{} // closed when inflight drops to zero; nil while idle
	closed  bool
}

// waitingJob is a job queued behind Concurrency jobs in service.
type waitingJob struct {
	job    *offload.Job
	load   bool
	failAt int
	at     time.Time // submission
}

type entry struct {
	key        offload.Key
	data       []byte
	prev, next *entry
	owner      uint8 // its share's owner (shares.go); 0 without shares
}

// reqState is what the tier remembers about one request: keys whose
// asynchronous existence check is queued or resolved, and keys whose load
// failed (they answer Miss for this request so that the manager does not
// promote them again and again, the #49328 livelock fix).
type reqState struct {
	queued   map[offload.Key]struct{}
	resolved map[offload.Key]struct{}
	missed   map[offload.Key]struct{}
}

// New returns a memory tier. Name defaults to "memory".
func New(cfg Config) (*Tier, error) {
	if cfg.Name == "" {
		cfg.Name = Type
	}
	if cfg.Medium > offload.MediumStorage {
		return nil, fmt.Errorf("memory tier %q: invalid medium %d", cfg.Name, cfg.Medium)
	}
	if cfg.Locality > offload.LocalityRemote {
		return nil, fmt.Errorf("memory tier %q: invalid locality %d", cfg.Name, cfg.Locality)
	}
	if cfg.CapacityBlocks < 0 {
		return nil, fmt.Errorf("memory tier %q: capacity_blocks %d: must be >= 0", cfg.Name, cfg.CapacityBlocks)
	}
	if cfg.Latency < 0 || cfg.BlockLatency < 0 {
		return nil, fmt.Errorf("memory tier %q: latency %v, block latency %v: must be >= 0", cfg.Name, cfg.Latency, cfg.BlockLatency)
	}
	if cfg.Concurrency < 0 || cfg.QueueDepth < 0 {
		return nil, fmt.Errorf("memory tier %q: concurrency %d, queue depth %d: must be >= 0", cfg.Name, cfg.Concurrency, cfg.QueueDepth)
	}
	if !(cfg.FailRate >= 0 && cfg.FailRate <= 1) { // also rejects NaN
		return nil, fmt.Errorf("memory tier %q: fail_rate %v: must be in [0, 1]", cfg.Name, cfg.FailRate)
	}
	sh, err := newShares(cfg.Shares, cfg.CapacityBlocks, cfg.BlockBytes)
	if err != nil {
		return nil, fmt.Errorf("memory tier %q: %w", cfg.Name, err)
	}
	t := &Tier{
		cfg:     cfg,
		sh:      sh,
		closing: make(chan struct{}),
		rng:     rand.New(rand.NewPCG(uint64(cfg.Seed), 0x6b7674696572)),
		blocks:  make(map[offload.Key]*entry),
		reqs:    make(map[string]*reqState),
		asking:  make(map[*reqState]struct{}),
		serving: make(map[uint64]chan struct{}),
	}
	t.lrus = make([]entry, sh.owners())
	t.resetLRUs()
	if sh != nil {
		t.exhausted = make([]bool, sh.owners())
	}
	return t, nil
}

// Name returns the configured name.
func (t *Tier) Name() string { return t.cfg.Name }

// Type returns "memory".
func (t *Tier) Type() string { return Type }

// Medium returns the configured medium (unspecified = dynamic).
func (t *Tier) Medium() offload.Medium { return t.cfg.Medium }

// Locality returns the configured locality (unspecified = dynamic).
func (t *Tier) Locality() offload.Locality { return t.cfg.Locality }

// ClaimsBlocks implements offload.BlockClaimer: a store reads its slots
// only when it copies them, at the end of its latency.
func (t *Tier) ClaimsBlocks() bool { return true }

// Lookup answers Hit when the tier holds key. In async-lookup mode a key
// not yet checked for this request answers Retry until the next
// OnScheduleEnd. A key whose load failed for this request answers Miss.
func (t *Tier) Lookup(key offload.Key, req *offload.ReqContext) offload.LookupResult {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return offload.Miss
	}
	if t.nmissed > 0 || t.cfg.AsyncLookup {
		rs := t.reqs[reqID(req)]
		if rs != nil {
			if _, ok := rs.missed[key]; ok {
				return offload.Miss
			}
		}
		if t.cfg.AsyncLookup {
			if rs == nil {
				rs = &reqState{}
				t.reqs[reqID(req)] = rs
			}
			if _, ok := rs.resolved[key]; !ok {
				if rs.queued == nil {
					rs.queued = make(map[offload.Key]struct{})
				}
				rs.queued[key] = struct{}{}
				t.asking[rs] = struct{}{}
				return offload.Retry
			}
		}
	}
	if _, ok := t.blocks[key]; ok {
		return offload.Hit
	}
	return offload.Miss
}

func reqID(req *offload.ReqContext) string {
	if req == nil {
		return ""
	}
	return req.ID
}

// SubmitStore copies the job's arena slots into the tier. Blocks the tier
// already holds are not copied again.
func (t *Tier) SubmitStore(job *offload.Job) { t.submit(job, false) }

// SubmitLoad copies the tier's blocks into the job's arena slots, in key
// order, stopping at the first block it cannot deliver; the result then
// reports the loaded prefix in SuccessfulKeys.
func (t *Tier) SubmitLoad(job *offload.Job) { t.submit(job, true) }

func (t *Tier) submit(job *offload.Job, load bool) {
	if job == nil {
		return // nothing to answer
	}
	failAt := -1 // index of the key at which an injected failure strikes
	if t.cfg.FailRate > 0 && t.rng.Float64() < t.cfg.FailRate {
		failAt = 0
		if load && len(job.Keys) > 1 {
			failAt = t.rng.IntN(len(job.Keys))
		}
	}
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		t.results = append(t.results, offload.JobResult{JobID: job.ID, Err: ErrClosed})
		return
	}
	if t.serviceTime(job) <= 0 {
		t.finish(job, load, failAt, now)
		return
	}
	if c := t.cfg.Concurrency; c > 0 && t.running >= c {
		if d := t.cfg.QueueDepth; d > 0 && len(t.waiting) >= d {
			t.results = append(t.results, offload.JobResult{JobID: job.ID,
				Err: offload.Refused(offload.RefusedQueueFull, fmt.Errorf("memory tier %q: queue of %d jobs full", t.cfg.Name, d))})
			return
		}
		t.addInflight()
		t.waiting = append(t.waiting, waitingJob{job, load, failAt, now})
		return
	}
	t.addInflight()
	t.startLocked(job, load, failAt, now)
}

// startLocked puts job in service: it completes after its service time.
// t.mu is held.
func (t *Tier) startLocked(job *offload.Job, load bool, failAt int, at time.Time) {
	t.running++
	cancel := make(chan struct{})
	t.serving[job.ID] = cancel
	go t.delayed(job, load, failAt, at, cancel)
}

func (t *Tier) serviceTime(job *offload.Job) time.Duration {
	return t.cfg.Latency + time.Duration(len(job.Keys))*t.cfg.BlockLatency
}

func (t *Tier) addInflight() {
	if t.inflight == 0 {
		t.idle = make(chan struct{})
	}
	t.inflight++
}

func (t *Tier) doneInflight() {
	t.inflight--
	if t.inflight == 0 {
		close(t.idle)
		t.idle = nil
	}
}

// delayed completes a job after its service time, or fails it at once
// when the tier closes, then starts the next waiting job.
func (t *Tier) delayed(job *offload.Job, load bool, failAt int, start time.Time, cancel chan struct{}) {
	timer := time.NewTimer(t.serviceTime(job))
	aborted, withdrawn := false, false
	select {
	case <-timer.C:
	case <-t.closing:
		timer.Stop()
		aborted = true
	case <-cancel:
		timer.Stop()
		withdrawn = true
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case withdrawn:
		// CancelQueued answered for it and counted it done.
	case t.serving[job.ID] != cancel:
		// Withdrawn just as its time came: nothing to do.
	case aborted:
		delete(t.serving, job.ID)
		t.results = append(t.results, offload.JobResult{JobID: job.ID, Err: ErrClosed, Duration: time.Since(start)})
		t.doneInflight()
	default:
		delete(t.serving, job.ID)
		t.finish(job, load, failAt, start)
		t.doneInflight()
	}
	t.running--
	if len(t.waiting) > 0 && !t.closed {
		w := t.waiting[0]
		t.waiting[0] = waitingJob{}
		t.waiting = t.waiting[1:]
		t.startLocked(w.job, w.load, w.failAt, w.at)
	}
}

// QueuedJobs implements offload.JobQueue: jobs waiting behind Concurrency
// jobs in service, and QueueDepth.
func (t *Tier) QueuedJobs() (queued, capacity int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.waiting), t.cfg.QueueDepth
}

// CancelQueued implements offload.JobQueue: a job waiting for its turn or
// still waiting out its latency (its transfer happens at the end) is
// withdrawn and never answered.
func (t *Tier) CancelQueued(id uint64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if c, ok := t.serving[id]; ok {
		delete(t.serving, id)
		close(c)
		t.doneInflight()
		return true
	}
	for i, w := range t.waiting {
		if w.job.ID == id {
			t.waiting = slices.Delete(t.waiting, i, i+1)
			t.doneInflight()
			return true
		}
	}
	return false
}

// finish performs the transfer and records the job's only result. t.mu is
// held.
func (t *Tier) finish(job *offload.Job, load bool, failAt int, start time.Time) {
	var res offload.JobResult
	if load {
		res = t.load(job, failAt)
	} else {
		res = t.store(job, failAt)
	}
	res.JobID = job.ID
	res.Duration = time.Since(start)
	t.results = append(t.results, res)
}

func (t *Tier) store(job *offload.Job, failAt int) offload.JobResult {
	if failAt >= 0 {
		return offload.JobResult{Err: fmt.Errorf("memory tier %q: store job %d: %w", t.cfg.Name, job.ID, ErrInjected)}
	}
	if len(job.Keys) != len(job.Slots) {
		return offload.JobResult{Err: fmt.Errorf("memory tier %q: store job %d: %d keys but %d slots", t.cfg.Name, job.ID, len(job.Keys), len(job.Slots))}
	}
	if len(job.Keys) > 0 && job.Arena == nil {
		return offload.JobResult{Err: fmt.Errorf("memory tier %q: store job %d: no arena", t.cfg.Name, job.ID)}
	}
	// Validate every slot first so that a bad job stores nothing.
	for _, s := range job.Slots {
		if _, err := job.Arena.Slot(s); err != nil {
			return offload.JobResult{Err: fmt.Errorf("memory tier %q: store job %d: %w", t.cfg.Name, job.ID, err)}
		}
	}
	// One pass, one map lookup per held key: held blocks are refreshed,
	// new ones evict and are copied in. Removals and stores are announced
	// once per job, removals first.
	var stored, removed, full []offload.Key
	var n int64
	for i, k := range job.Keys {
		if e := t.blocks[k]; e != nil {
			t.moveToFront(e)
			continue
		}
		if !job.Claim(i) {
			continue // taken back by the manager: not stored
		}
		owner := t.sh.ownerOf(k)
		var room bool
		if removed, room = t.evict(1, int(owner), removed); !room {
			job.Release(i)
			full = append(full, k)
			continue
		}
		src, _ := job.Arena.Slot(job.Slots[i])
		e := t.newEntry(k, len(src), owner)
		copy(e.data, src)
		job.Release(i)
		n += int64(len(src))
		t.blocks[k] = e
		t.pushFront(e)
		if t.cfg.Events {
			stored = append(stored, k)
		}
	}
	// A job with more new blocks than the capacity evicts blocks it stored
	// itself: announce only the blocks still held, after the removals, so
	// that a router replaying the events ends up with the tier's contents.
	stored = slices.DeleteFunc(stored, func(k offload.Key) bool { return t.blocks[k] == nil })
	t.announce(removed, true)
	t.announce(stored, false)
	if len(full) > 0 {
		ok := slices.DeleteFunc(slices.Clone(job.Keys), func(k offload.Key) bool { return slices.Contains(full, k) })
		return offload.JobResult{SuccessfulKeys: ok, Bytes: n,
			Err: fmt.Errorf("memory tier %q: store job %d: %d blocks: %w", t.cfg.Name, job.ID, len(full), ErrFull)}
	}
	return offload.JobResult{Success: true, Bytes: n}
}

func (t *Tier) load(job *offload.Job, failAt int) offload.JobResult {
	if len(job.Keys) != len(job.Slots) {
		return offload.JobResult{Err: fmt.Errorf("memory tier %q: load job %d: %d keys but %d slots", t.cfg.Name, job.ID, len(job.Keys), len(job.Slots))}
	}
	var n int64
	var err error
	done := 0
	for i, k := range job.Keys {
		if i == failAt {
			err = fmt.Errorf("memory tier %q: load %s: %w", t.cfg.Name, k, ErrInjected)
			break
		}
		e, ok := t.blocks[k]
		if !ok {
			err = fmt.Errorf("memory tier %q: load %s: %w", t.cfg.Name, k, ErrNotPresent)
			break
		}
		if job.Arena == nil {
			err = fmt.Errorf("memory tier %q: load job %d: no arena", t.cfg.Name, job.ID)
			break
		}
		dst, serr := job.Arena.Slot(job.Slots[i])
		if serr != nil {
			err = fmt.Errorf("memory tier %q: load %s: %w", t.cfg.Name, k, serr)
			break
		}
		if len(dst) != len(e.data) {
			err = fmt.Errorf("memory tier %q: load %s: block is %d bytes, slot %d", t.cfg.Name, k, len(e.data), len(dst))
			break
		}
		copy(dst, e.data)
		t.moveToFront(e)
		n += int64(len(dst))
		done++
	}
	if err == nil {
		return offload.JobResult{Success: true, Bytes: n}
	}
	// Remember the failed key for this request so that it is not promoted
	// again in a loop; other requests may still try. Only requests the
	// tier knows (announced and not finished) keep such state, so a late
	// failure of a finished request's job leaves nothing behind.
	if rs := t.reqs[reqID(job.Req)]; rs != nil {
		if rs.missed == nil {
			rs.missed = make(map[offload.Key]struct{})
		}
		if _, dup := rs.missed[job.Keys[done]]; !dup {
			rs.missed[job.Keys[done]] = struct{}{}
			t.nmissed++
		}
	}
	res := offload.JobResult{Bytes: n, Err: err}
	if done > 0 {
		res.SuccessfulKeys = job.Keys[:done:done]
	}
	return res
}

// evict makes room for n new blocks of storer's (the owner of their
// share; 0 without shares) under the capacity limit, appending the
// evicted keys to removed when events are on. It reports whether there
// is room: with shares, an owner within its quota gives no block to
// another's store.
func (t *Tier) evict(n, storer int, removed []offload.Key) ([]offload.Key, bool) {
	if t.cfg.CapacityBlocks <= 0 {
		return removed, true
	}
	exhausted := t.exhausted // owners with no block left to give
	clear(exhausted)
	for len(t.blocks)+n > t.cfg.CapacityBlocks {
		o := 0
		if t.sh != nil {
			if o = t.sh.victim(exhausted, storer); o < 0 {
				return removed, false
			}
		}
		lru := &t.lrus[o]
		if lru.next == lru {
			if t.sh == nil {
				break // n > capacity: as many as there are
			}
			exhausted[o] = true
			continue
		}
		e := lru.next
		for e != lru && t.keep != nil && t.keep(e.key) {
			e = e.next // kept: the next oldest
		}
		if e == lru {
			if t.sh == nil {
				return removed, false // every block left is kept
			}
			exhausted[o] = true
			continue
		}
		t.drop(e)
		t.evicted++
		if t.cfg.Events {
			removed = append(removed, e.key)
		}
	}
	return removed, true
}

// Keep passes over the blocks keep reports when the tier evicts
// (offload.Keeper: routers' pins).
func (t *Tier) Keep(keep func(offload.Key) bool) {
	t.mu.Lock()
	t.keep = keep
	t.mu.Unlock()
}

// drop forgets e, keeping its buffer for a later block.
func (t *Tier) drop(e *entry) {
	t.unlink(e)
	delete(t.blocks, e.key)
	t.sh.release(e.owner)
	t.spare = append(t.spare, e)
}

// resetLRUs empties every recency list.
func (t *Tier) resetLRUs() {
	for i := range t.lrus {
		l := &t.lrus[i]
		l.prev, l.next = l, l
	}
}

// announce buffers one event for keys, if any.
func (t *Tier) announce(keys []offload.Key, removed bool) {
	if len(keys) > 0 {
		t.events = append(t.events, offload.Event{Keys: keys, Medium: t.cfg.Medium, Locality: t.cfg.Locality, Removed: removed, Tier: t.cfg.Name})
	}
}

// newEntry returns an entry for key with a buffer of size n, reusing an
// evicted one: blocks are fixed-size, so churn should not churn the heap.
// The entry counts against owner's share from now on.
func (t *Tier) newEntry(key offload.Key, n int, owner uint8) *entry {
	t.sh.hold(owner)
	for len(t.spare) > 0 {
		e := t.spare[len(t.spare)-1]
		t.spare[len(t.spare)-1] = nil
		t.spare = t.spare[:len(t.spare)-1]
		if cap(e.data) >= n {
			*e = entry{key: key, data: e.data[:n], owner: owner}
			return e
		}
	}
	return &entry{key: key, data: make([]byte, n), owner: owner}
}

func (t *Tier) unlink(e *entry) {
	e.prev.next = e.next
	e.next.prev = e.prev
	e.prev, e.next = nil, nil
}

// pushFront makes e the most recently used entry of its owner (the
// list's tail).
func (t *Tier) pushFront(e *entry) {
	lru := &t.lrus[e.owner]
	e.prev = lru.prev
	e.next = lru
	lru.prev.next = e
	lru.prev = e
}

func (t *Tier) moveToFront(e *entry) {
	t.unlink(e)
	t.pushFront(e)
}

// FinishedJobs returns the results that became available since the last
// call.
func (t *Tier) FinishedJobs() []offload.JobResult {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := t.results
	t.results = nil
	return r
}

// DrainJobs waits until every submitted job has a result available, or ctx
// ends.
func (t *Tier) DrainJobs(ctx context.Context) error {
	t.mu.Lock()
	idle := t.idle
	t.mu.Unlock()
	if idle == nil {
		return nil
	}
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("memory tier %q: drain: %w", t.cfg.Name, ctx.Err())
	}
}

// HasPendingWork reports jobs in flight, results not yet collected, or
// asynchronous lookups waiting for the next step.
func (t *Tier) HasPendingWork() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.inflight > 0 || len(t.results) > 0 {
		return true
	}
	return len(t.asking) > 0
}

// Touch marks the keys the tier holds as recently used; the first key
// ends up most recent, as in the primary's LRU.
func (t *Tier) Touch(keys []offload.Key, _ *offload.ReqContext) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i := len(keys) - 1; i >= 0; i-- {
		if e, ok := t.blocks[keys[i]]; ok {
			t.moveToFront(e)
		}
	}
}

// OnNewRequest starts tracking the request's lookup state. It returns
// BlockLevel: the memory tier needs no prefix-hit blocks offered again.
func (t *Tier) OnNewRequest(req *offload.ReqContext) offload.OffloadPolicy {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.reqs[reqID(req)]; !ok && !t.closed {
		t.reqs[reqID(req)] = &reqState{}
	}
	return offload.BlockLevel
}

// OnRequestFinished forgets the request's lookup state.
func (t *Tier) OnRequestFinished(req *offload.ReqContext) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if rs, ok := t.reqs[reqID(req)]; ok {
		t.nmissed -= len(rs.missed)
		delete(t.reqs, reqID(req))
		delete(t.asking, rs)
	}
}

// OnScheduleEnd resolves the asynchronous lookups queued during the step.
func (t *Tier) OnScheduleEnd(offload.ScheduleEnd) {
	if !t.cfg.AsyncLookup {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for rs := range t.asking {
		if rs.resolved == nil {
			rs.resolved = make(map[offload.Key]struct{}, len(rs.queued))
		}
		for k := range rs.queued {
			rs.resolved[k] = struct{}{}
		}
		clear(rs.queued)
	}
	clear(t.asking)
}

// TakeEvents returns and clears the buffered stored/removed events.
func (t *Tier) TakeEvents() []offload.Event {
	t.mu.Lock()
	defer t.mu.Unlock()
	ev := t.events
	t.events = nil
	return ev
}

// Close fails every job still waiting out its latency, waits (bounded by
// ctx) until every job has its result, and drops the stored blocks.
// Results stay available to FinishedJobs; later jobs fail with ErrClosed.
func (t *Tier) Close(ctx context.Context) error {
	t.mu.Lock()
	if !t.closed {
		t.closed = true
		close(t.closing)
		for _, w := range t.waiting {
			t.results = append(t.results, offload.JobResult{JobID: w.job.ID, Err: ErrClosed, Duration: time.Since(w.at)})
			t.doneInflight()
		}
		t.waiting = nil
	}
	t.mu.Unlock()
	if err := t.DrainJobs(ctx); err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	clear(t.blocks)
	t.resetLRUs()
	t.sh.clear()
	t.spare = nil
	clear(t.reqs)
	t.nmissed = 0
	return nil
}

// Report implements offload.Reporter: the blocks the tier holds and the
// ones it evicted.
func (t *Tier) Report() offload.TierReport {
	t.mu.Lock()
	defer t.mu.Unlock()
	return offload.TierReport{OccupancyBlocks: int64(len(t.blocks)), OccupancyBytes: -1, Evictions: t.evicted, Shares: t.sh.report()}
}

// Len returns the number of blocks the tier holds.
func (t *Tier) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.blocks)
}

// Evictions returns the number of blocks evicted to make room.
func (t *Tier) Evictions() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.evicted
}

// Contains reports whether the tier holds key (no recency update).
func (t *Tier) Contains(key offload.Key) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, ok := t.blocks[key]
	return ok
}

// Holds sets held[i] for each of keys the tier holds (tiering.Holder):
// no recency update, no statistics, no event.
func (t *Tier) Holds(keys []offload.Key, held []bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i, k := range keys {
		if _, ok := t.blocks[k]; ok {
			held[i] = true
		}
	}
}

// Keys appends the keys of the blocks the tier holds that match accepts
// (tiering.Lister).
func (t *Tier) Keys(match func(offload.Key) bool, dst []offload.Key) []offload.Key {
	t.mu.Lock()
	defer t.mu.Unlock()
	for k := range t.blocks {
		if match(k) {
			dst = append(dst, k)
		}
	}
	return dst
}

// Delete removes the blocks of keys the tier holds and announces their
// removal (tiering.Deleter); it returns how many it removed.
func (t *Tier) Delete(_ context.Context, keys []offload.Key) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var gone []offload.Key
	for _, k := range keys {
		if e, ok := t.blocks[k]; ok {
			t.drop(e)
			gone = append(gone, k)
		}
	}
	if t.cfg.Events {
		t.announce(gone, true)
	}
	return len(gone), nil
}

// Get returns a copy of the bytes stored under key.
func (t *Tier) Get(key offload.Key) ([]byte, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.blocks[key]
	if !ok {
		return nil, false
	}
	return append([]byte(nil), e.data...), true
}

// Remove drops key directly, bypassing jobs (a block lost behind the
// manager's back, for tests), and emits a removed event. It reports
// whether the tier held key.
func (t *Tier) Remove(key offload.Key) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.blocks[key]
	if !ok {
		return false
	}
	t.drop(e)
	if t.cfg.Events {
		t.announce([]offload.Key{key}, true)
	}
	return true
}

// Put stores data under key directly, bypassing jobs: for seeding a tier
// in tests and tools. It evicts like a store and emits a stored event; it
// reports false when the key's share leaves no room (ErrFull).
func (t *Tier) Put(key offload.Key, data []byte) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e, ok := t.blocks[key]; ok {
		e.data = append(e.data[:0], data...)
		t.moveToFront(e)
		return true
	}
	owner := t.sh.ownerOf(key)
	removed, room := t.evict(1, int(owner), nil)
	t.announce(removed, true)
	if !room {
		return false
	}
	e := t.newEntry(key, len(data), owner)
	copy(e.data, data)
	t.blocks[key] = e
	t.pushFront(e)
	if t.cfg.Events {
		t.announce([]offload.Key{key}, false)
	}
	return true
}

var (
	_ offload.SecondaryTier = (*Tier)(nil)
	_ offload.JobQueue      = (*Tier)(nil)
)

// DescribeCapacity says, for a log line, how much the tier holds.
func (t *Tier) DescribeCapacity() string { return fmt.Sprintf("%d blocks held", t.Len()) }
