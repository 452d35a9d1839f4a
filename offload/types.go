package offload

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// LookupResult is the answer to a per-key lookup (docs/semantics.md §1.7).
type LookupResult uint8

// Lookup results. The zero value is Miss.
const (
	// Miss: not in any participating tier, or the primary is full so no
	// promotion could start.
	Miss LookupResult = iota
	// Hit: in the primary tier and readable now.
	Hit
	// HitPending: in the primary tier but not yet readable (a store or a
	// promotion is in flight). Counts as a hit for the prefix length but the
	// caller must defer.
	HitPending
	// Retry: location uncertain (a secondary existence check or a promotion
	// just started); ask again on a later step. Not a hit.
	Retry
)

// String returns the upstream name of r.
func (r LookupResult) String() string {
	switch r {
	case Miss:
		return "MISS"
	case Hit:
		return "HIT"
	case HitPending:
		return "HIT_PENDING"
	case Retry:
		return "RETRY"
	}
	return fmt.Sprintf("LookupResult(%d)", uint8(r))
}

// OffloadPolicy says how the connector offers blocks of a request for
// storing (docs/semantics.md §1.8, §4.7).
type OffloadPolicy uint8

// Offload policies.
const (
	// BlockLevel: only newly computed chunks are offered to PrepareStore.
	BlockLevel OffloadPolicy = iota
	// RequestLevel: prefix-hit chunks are offered again so that they can be
	// cascaded to the tiers that asked for request-level stores.
	RequestLevel
)

// String returns the upstream name of p.
func (p OffloadPolicy) String() string {
	if p == RequestLevel {
		return "REQUEST_LEVEL"
	}
	return "BLOCK_LEVEL"
}

// ScheduleEnd describes the end of one engine step (docs/semantics.md §1.8).
type ScheduleEnd struct {
	NewReqIDs       []string
	PreemptedReqIDs []string
}

// PrepareStoreOutput is what the primary reserved for a store: the keys
// that were not yet present, their slots (co-indexed) and the keys it
// evicted to make room.
type PrepareStoreOutput struct {
	KeysToStore []Key
	Slots       []int64
	Evicted     []Key
}

// Event is an offloading event: keys stored in or removed from one medium
// (docs/semantics.md §1.8). Tier names the tier that emitted it ("" for the primary).
type Event struct {
	Keys     []Key
	Medium   Medium
	Locality Locality
	Removed  bool
	Tier     string
}

// Arena is the slot memory a job transfers into or out of: kvtier's
// primary tier in manager mode, an engine's region in tier mode. Slots are
// fixed-size rows; Slot returns a view of one row (no copy).
type Arena interface {
	SlotSize() int
	NumSlots() int
	// Slot returns the bytes of slot i, or an error wrapping
	// ErrSlotOutOfRange.
	Slot(i int64) ([]byte, error)
}

// ErrSlotOutOfRange reports a slot index outside the arena.
var ErrSlotOutOfRange = errors.New("slot out of range")

// Job is one transfer between the arena and a secondary tier: a promotion
// (tier → arena, Promotion true) or a cascade (arena → tier). Slots[i] is
// the arena slot of Keys[i]. Every submitted job gets exactly one
// JobResult.
type Job struct {
	ID        uint64
	Keys      []Key
	Slots     []int64
	Promotion bool
	Req       *ReqContext
	Arena     Arena
	// Claims is set on the store jobs of a cascade whose blocks the
	// manager may take back one by one; tiers reach it through Claim and
	// Release (see BlockClaimer).
	Claims Claims
}

// JobResult reports the outcome of one job. For a failed promotion,
// SuccessfulKeys holds the keys that were loaded completely, in the order
// of Keys (any subsequence of it: a bad block fails only itself)
// (the remaining keys were not); nil means none. A successful cascade
// may have refused some of its blocks without I/O because the server
// that holds them (one node of a cluster) is down: Refused counts them,
// and the manager counts them as dropped (RefusedTierDown) rather than
// cascaded.
type JobResult struct {
	JobID          uint64
	Success        bool
	SuccessfulKeys []Key
	Refused        int
	Bytes          int64
	Duration       time.Duration
	Err            error
}

// SecondaryTier is the contract of a secondary tier (docs/semantics.md §5). All methods
// except DrainJobs and Close must not block: I/O happens on the tier's own
// goroutines and is reported through FinishedJobs. The manager calls the
// tier from one goroutine at a time.
//
// The manager, not the tier, applies the request's load and store filters:
// a tier is only asked about requests its declared Medium and Locality are
// allowed for. A tier that declares MediumUnspecified or
// LocalityUnspecified is dynamic on that axis and must enforce the
// request's filter itself.
type SecondaryTier interface {
	// Name is the configured tier name (unique in a stack); Type is the
	// configured type (memory, fs, s3, redis, peer).
	Name() string
	Type() string
	Medium() Medium
	Locality() Locality

	// Lookup answers Hit, Miss or Retry (existence check in flight).
	Lookup(key Key, req *ReqContext) LookupResult
	// SubmitStore copies job.Slots of job.Arena into the tier.
	SubmitStore(job *Job)
	// SubmitLoad copies the tier's blocks into job.Slots of job.Arena.
	SubmitLoad(job *Job)
	// FinishedJobs returns the results that became available since the
	// last call, each submitted job exactly once.
	FinishedJobs() []JobResult
	// DrainJobs blocks until every submitted job has a result available
	// (or ctx ends). It never aborts a transfer midway.
	DrainJobs(ctx context.Context) error
	// HasPendingWork reports jobs or lookups in flight.
	HasPendingWork() bool

	Touch(keys []Key, req *ReqContext)
	OnNewRequest(req *ReqContext) OffloadPolicy
	OnRequestFinished(req *ReqContext)
	OnScheduleEnd(se ScheduleEnd)
	TakeEvents() []Event

	// Close answers every outstanding job (failed if not done) and
	// releases the tier's resources.
	Close(ctx context.Context) error
}
