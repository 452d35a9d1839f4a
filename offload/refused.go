package offload

import "errors"

// ErrRefused marks the result of a job that a tier refused without
// touching the arena: its queue was full, it already had its maximum of
// jobs in flight, or its server is down. For a cascade the manager counts
// such a job as dropped (the blocks stay in the primary only), not as a
// failure; for a promotion it is a failed load like any other.
var ErrRefused = errors.New("job refused")

// Reasons a tier gives for refusing a job (RefusedError.Reason).
const (
	// RefusedQueueFull: the tier's queue, or its bound on jobs in flight,
	// is full.
	RefusedQueueFull = "queue_full"
	// RefusedTierDown: the tier's server is considered down.
	RefusedTierDown = "tier_down"
)

// RefusedError is the error of a refused job's result. It matches
// ErrRefused and its cause with errors.Is.
type RefusedError struct {
	// Reason is RefusedQueueFull or RefusedTierDown.
	Reason string
	// Err says what happened, e.g. "fs tier \"disk\" queue full".
	Err error
}

// Refused returns a RefusedError for reason and err.
func Refused(reason string, err error) error { return &RefusedError{Reason: reason, Err: err} }

func (e *RefusedError) Error() string {
	if e.Err == nil {
		return "job refused: " + e.Reason
	}
	return e.Err.Error() + " (job refused: " + e.Reason + ")"
}

// Unwrap returns ErrRefused and the cause.
func (e *RefusedError) Unwrap() []error { return []error{ErrRefused, e.Err} }

// RefusalReason returns the reason of a refused job's error, and false
// when err does not report a refusal.
func RefusalReason(err error) (string, bool) {
	var re *RefusedError
	if errors.As(err, &re) {
		return re.Reason, true
	}
	if errors.Is(err, ErrRefused) {
		return RefusedQueueFull, true
	}
	return "", false
}

// JobQueue is implemented by tiers that queue submitted jobs until one of
// their workers starts them (the fs tier, a memory tier with bounded
// concurrency). It lets the manager see the queue and withdraw queued
// cascades so that an engine's store can evict their source blocks.
type JobQueue interface {
	// QueuedJobs reports the jobs submitted and not yet started, and the
	// queue's capacity (0: unbounded). It must not block on I/O.
	QueuedJobs() (queued, capacity int)
	// CancelQueued withdraws job id if no worker has started it. On true
	// the tier forgets the job: it never answers it and never touches its
	// slots, and the caller answers it instead. It reports false for a job
	// that has started, has finished or is unknown.
	CancelQueued(id uint64) bool
}

// ReadOnly is implemented by tiers that take no stores (a peer tier that
// only serves what other daemons hold): when ReadOnly reports true the
// manager sends them no cascades and their share of the cascade pin
// budget goes to the other tiers.
type ReadOnly interface {
	ReadOnly() bool
}
