package remote

import (
	"sync"
	"sync/atomic"

	"github.com/kvtier/kvtier/offload"
)

// Stats is a snapshot of a remote tier's counters (monotonic since start)
// and gauges, for metrics.
type Stats struct {
	Healthy bool  // gauge: the server is considered up
	Downs   int64 // times the server was marked down
	// Lookups counts Lookup calls; LookupsUnhealthy those answered Miss
	// without asking because the server was down.
	Lookups          int64
	LookupsUnhealthy int64
	// Probes counts existence checks sent; ProbeErrors those that failed
	// (each then counts as a miss).
	Probes      int64
	ProbeErrors int64

	// Store (cascade) and load (promotion) jobs: completed successfully,
	// failed while running, and refused at submission (server down, tier
	// closed, too many in flight) without any I/O.
	StoreJobsOK      int64
	StoreJobsFailed  int64
	StoreJobsSkipped int64
	LoadJobsOK       int64
	LoadJobsFailed   int64
	LoadJobsSkipped  int64

	BlocksStored  int64 // written by this tier
	BlocksExisted int64 // store skipped because the server already had the block
	BlocksLoaded  int64
	BytesWritten  int64 // payload bytes
	BytesRead     int64

	// BlocksNodeDown counts blocks of jobs that ran whose server (one
	// node of a cluster) was down: not loaded or not stored, without I/O.
	BlocksNodeDown int64

	Corrupted    int64 // blocks that failed verification on load
	Deleted      int64 // corrupted blocks deleted
	SizeMismatch int64 // intact blocks of another slot size (kept)
	Retries      int64 // operations retried after a transient failure
	Timeouts     int64 // operation attempts that hit the timeout

	EventsDropped int64 // events lost because nobody took them in time

	// Reconciliation (events on): passes run, passes that failed, and the
	// removals they published for blocks the server no longer held.
	Reconciles, ReconcileFailures, ReconciledRemovals int64

	InFlightJobs int // gauge
}

// Counters are the live counters behind Stats. The zero value is ready.
type Counters struct {
	Lookups, LookupsUnhealthy, Probes, ProbeErrors      atomic.Int64
	StoreJobsOK, StoreJobsFailed, StoreJobsSkipped      atomic.Int64
	LoadJobsOK, LoadJobsFailed, LoadJobsSkipped         atomic.Int64
	BlocksStored, BlocksExisted, BlocksLoaded           atomic.Int64
	BytesWritten, BytesRead, BlocksNodeDown             atomic.Int64
	Corrupted, Deleted, SizeMismatch, Retries, Timeouts atomic.Int64
}

// Snapshot copies the counters into a Stats; the caller fills the gauges.
func (c *Counters) Snapshot() Stats {
	return Stats{
		Lookups: c.Lookups.Load(), LookupsUnhealthy: c.LookupsUnhealthy.Load(),
		Probes: c.Probes.Load(), ProbeErrors: c.ProbeErrors.Load(),
		StoreJobsOK: c.StoreJobsOK.Load(), StoreJobsFailed: c.StoreJobsFailed.Load(), StoreJobsSkipped: c.StoreJobsSkipped.Load(),
		LoadJobsOK: c.LoadJobsOK.Load(), LoadJobsFailed: c.LoadJobsFailed.Load(), LoadJobsSkipped: c.LoadJobsSkipped.Load(),
		BlocksStored: c.BlocksStored.Load(), BlocksExisted: c.BlocksExisted.Load(), BlocksLoaded: c.BlocksLoaded.Load(),
		BytesWritten: c.BytesWritten.Load(), BytesRead: c.BytesRead.Load(), BlocksNodeDown: c.BlocksNodeDown.Load(),
		Corrupted: c.Corrupted.Load(), Deleted: c.Deleted.Load(), SizeMismatch: c.SizeMismatch.Load(),
		Retries: c.Retries.Load(), Timeouts: c.Timeouts.Load(),
	}
}

// DefaultMaxEvents bounds an Events buffer when nobody takes events.
const DefaultMaxEvents = 1 << 16

// Events buffers a tier's events between TakeEvents calls. Events beyond
// the bound are dropped and counted rather than growing without limit.
// A nil *Events is a tier whose events are off: it records nothing. Safe
// for concurrent use.
type Events struct {
	tier     string
	medium   offload.Medium
	locality offload.Locality

	mu      sync.Mutex
	buf     []offload.Event
	max     int
	dropped atomic.Int64
	ann     announced
}

// NewEvents returns a buffer for the events of the tier named tier, which
// declares medium m and locality l, holding at most max events (<= 0
// means DefaultMaxEvents).
func NewEvents(tier string, m offload.Medium, l offload.Locality, max int) *Events {
	if max <= 0 {
		max = DefaultMaxEvents
	}
	return &Events{tier: tier, medium: m, locality: l, max: max, ann: announced{max: DefaultMaxAnnounced}}
}

// Stored records that the tier now holds keys and remembers them as
// announced (see Reconcile). When the announced set is full its oldest
// keys are published as removed.
func (e *Events) Stored(keys []offload.Key) {
	if e == nil || len(keys) == 0 {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.appendLocked(keys, false)
	if out := e.ann.add(keys); len(out) > 0 {
		e.appendLocked(out, true)
	}
}

// Removed records that the tier no longer holds keys. Only keys it
// announced are published: a removal the index never saw a store for
// (another daemon's block on a shared server) tells a router nothing.
func (e *Events) Removed(keys []offload.Key) {
	if e == nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if out := e.ann.remove(keys); len(out) > 0 {
		e.appendLocked(out, true)
	}
}

func (e *Events) appendLocked(keys []offload.Key, removed bool) {
	if len(e.buf) >= e.max {
		e.dropped.Add(1)
		return
	}
	e.buf = append(e.buf, offload.Event{Keys: keys, Medium: e.medium, Locality: e.locality, Removed: removed, Tier: e.tier})
}

// Take returns the buffered events in order and empties the buffer.
func (e *Events) Take() []offload.Event {
	if e == nil {
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	out := e.buf
	e.buf = nil
	return out
}

// Dropped returns the number of events dropped so far.
func (e *Events) Dropped() int64 {
	if e == nil {
		return 0
	}
	return e.dropped.Load()
}

// keyQueue collects keys produced on worker goroutines for the tier to
// apply on the manager's goroutine (MarkMiss, Forget). Safe for
// concurrent use; bounded so that a tier nobody polls cannot grow it
// forever (beyond the bound keys are dropped: the queue is advisory).
type keyQueue struct {
	mu   sync.Mutex
	keys []offload.Key
}

const maxQueuedKeys = 1 << 16

// Add appends keys.
func (q *keyQueue) Add(keys ...offload.Key) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if room := maxQueuedKeys - len(q.keys); room < len(keys) {
		keys = keys[:max(room, 0)]
	}
	q.keys = append(q.keys, keys...)
}

// Take returns the queued keys and empties the queue.
func (q *keyQueue) Take() []offload.Key {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := q.keys
	q.keys = nil
	return out
}

// ReportOf is the offload.TierReport of a remote tier's stats: what a
// tier's Report returns, with what only it knows added.
func ReportOf(st Stats) offload.TierReport {
	r := offload.UnknownOccupancy()
	r.CorruptBlocks, r.CorruptDeleted = uint64(st.Corrupted), uint64(st.Deleted)
	r.Remote = &offload.RemoteReport{
		Healthy:            st.Healthy,
		LookupsUnhealthy:   uint64(st.LookupsUnhealthy),
		LoadJobsSkipped:    uint64(st.LoadJobsSkipped),
		StoreJobsSkipped:   uint64(st.StoreJobsSkipped),
		ReconciledRemovals: uint64(st.ReconciledRemovals),
		ReconcileFailures:  uint64(st.ReconcileFailures),
		NodeDownBlocks:     uint64(st.BlocksNodeDown),
	}
	return r
}
