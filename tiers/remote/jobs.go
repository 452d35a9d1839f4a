package remote

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/kvtier/kvtier/offload"
)

// ErrClosed is returned (wrapped) for jobs submitted after Close or cut
// short by it.
var ErrClosed = errors.New("tier closed")

// ErrOverloaded is returned (wrapped) for a job refused because the tier
// already has its maximum number of jobs in flight.
var ErrOverloaded = errors.New("too many jobs in flight")

// RunFunc performs one job. It runs on its own goroutine and must honour
// ctx, which Close cancels. The returned result's JobID is filled in by
// the job table.
type RunFunc func(ctx context.Context, job *offload.Job) offload.JobResult

// JobTable answers every submitted job exactly once: from its RunFunc, at
// once when refused, or as failed when Close gives up waiting for it.
// Methods are safe for concurrent use; Submit never blocks. Remote tiers
// get it through Base; a tier that is not a Base (the peer tier) uses it
// directly.
type JobTable struct {
	name        string
	maxInflight int

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	active  map[uint64]*offload.Job
	results []offload.JobResult
	idle    chan struct{} // closed when active becomes empty; nil while idle
	closed  bool
}

// NewJobTable returns a job table admitting at most maxInflight concurrent
// jobs (<= 0 means 64). name prefixes error messages.
func NewJobTable(name string, maxInflight int) *JobTable {
	if maxInflight <= 0 {
		maxInflight = 64
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &JobTable{name: name, maxInflight: maxInflight, ctx: ctx, cancel: cancel, active: make(map[uint64]*offload.Job)}
}

// Submit starts run for job on a new goroutine and reports true, or
// answers the job as failed at once and reports false when the table is
// closed or full.
func (j *JobTable) Submit(job *offload.Job, run RunFunc) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	switch {
	case j.closed:
		j.results = append(j.results, failed(job, fmt.Errorf("%s: job %d: %w", j.name, job.ID, ErrClosed)))
		return false
	case len(j.active) >= j.maxInflight:
		j.results = append(j.results, failed(job, offload.Refused(offload.RefusedQueueFull, fmt.Errorf("%s: job %d: %w (%d)", j.name, job.ID, ErrOverloaded, j.maxInflight))))
		return false
	}
	if len(j.active) == 0 {
		j.idle = make(chan struct{})
	}
	j.active[job.ID] = job
	j.wg.Add(1)
	go func() {
		defer j.wg.Done()
		j.finish(j.run(job, run))
	}()
	return true
}

// run calls fn, turning a panic into a failed result so that a bug in one
// job cannot take the daemon down or leave the job unanswered.
func (j *JobTable) run(job *offload.Job, fn RunFunc) (res offload.JobResult) {
	defer func() {
		if p := recover(); p != nil {
			res = failed(job, fmt.Errorf("%s: job %d: panic: %v", j.name, job.ID, p))
		}
		res.JobID = job.ID
	}()
	return fn(j.ctx, job)
}

// Fail answers job as failed with err without running it.
func (j *JobTable) Fail(job *offload.Job, err error) {
	j.mu.Lock()
	j.results = append(j.results, failed(job, err))
	j.mu.Unlock()
}

func failed(job *offload.Job, err error) offload.JobResult {
	return offload.JobResult{JobID: job.ID, Err: err}
}

// finish records res unless Close already answered the job.
func (j *JobTable) finish(res offload.JobResult) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if _, ok := j.active[res.JobID]; !ok {
		return
	}
	delete(j.active, res.JobID)
	j.results = append(j.results, res)
	j.markIdle()
}

func (j *JobTable) markIdle() {
	if len(j.active) == 0 && j.idle != nil {
		close(j.idle)
		j.idle = nil
	}
}

// Take returns the results collected since the previous call.
func (j *JobTable) Take() []offload.JobResult {
	j.mu.Lock()
	defer j.mu.Unlock()
	if len(j.results) == 0 {
		return nil
	}
	out := j.results
	j.results = nil
	return out
}

// Active returns the number of jobs in flight.
func (j *JobTable) Active() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return len(j.active)
}

// Pending reports jobs in flight or results not yet taken.
func (j *JobTable) Pending() bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return len(j.active) > 0 || len(j.results) > 0
}

// Drain waits until no job is in flight (every result is available to
// Take) or ctx ends.
func (j *JobTable) Drain(ctx context.Context) error {
	j.mu.Lock()
	idle := j.idle
	j.mu.Unlock()
	if idle == nil {
		return nil
	}
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%s: drain: %w", j.name, ctx.Err())
	}
}

// Close refuses new jobs, cancels the running ones and waits for them
// until ctx ends; jobs still running then are answered as failed (their
// late results are dropped). It is idempotent.
func (j *JobTable) Close(ctx context.Context) error {
	j.mu.Lock()
	j.closed = true
	j.mu.Unlock()
	j.cancel()

	done := make(chan struct{})
	go func() { j.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	for id, job := range j.active {
		j.results = append(j.results, failed(job, fmt.Errorf("%s: job %d: %w before it finished", j.name, id, ErrClosed)))
		delete(j.active, id)
	}
	j.markIdle()
	return fmt.Errorf("%s: close: jobs still running: %w", j.name, ctx.Err())
}

// Backoff returns the pause before retry attempt n (1-based) with base b:
// b, 2b, 4b … capped at 32b, with up to 50% added jitter derived from
// seed so concurrent retries do not march in step.
func Backoff(b time.Duration, n int, seed uint64) time.Duration {
	if b <= 0 {
		return 0
	}
	if n > 6 {
		n = 6
	}
	d := b << (n - 1)
	// splitmix64 step: cheap deterministic jitter without shared state.
	z := seed + uint64(n)*0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	z ^= z >> 31
	return d + time.Duration(z%uint64(d/2+1))
}

// Sleep pauses for d or until ctx ends, reporting whether the full pause
// elapsed.
func Sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// ForEach calls fn(ctx, i) for i in [0, n) concurrently, at most
// cap(sem) calls at a time across every ForEach sharing sem, and returns
// the errors co-indexed with i. It returns when every started call has
// returned; calls not started because ctx ended get ctx's error. A call
// that panics returns the panic as its error: it runs on a goroutine of
// its own, where the job table could not recover it, and must give its
// sem slot back.
func ForEach(ctx context.Context, sem chan struct{}, n int, fn func(ctx context.Context, i int) error) []error {
	errs := make([]error, n)
	call := func(i int) {
		defer func() {
			<-sem
			if p := recover(); p != nil {
				errs[i] = fmt.Errorf("panic: %v", p)
			}
		}()
		errs[i] = fn(ctx, i)
	}
	if n == 1 {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			errs[0] = ctx.Err()
			return errs
		}
		call(0)
		return errs
	}
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			for ; i < n; i++ {
				errs[i] = ctx.Err()
			}
			wg.Wait()
			return errs
		}
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			call(i)
		}(i)
	}
	wg.Wait()
	return errs
}

// loadedKeys returns the keys whose error is nil, in order, and the first
// error: a bad block fails only itself (nil when none loaded).
func loadedKeys(keys []offload.Key, errs []error) ([]offload.Key, error) {
	var first error
	var loaded []offload.Key
	for i, err := range errs {
		if err != nil {
			if first == nil {
				first = err
				loaded = append(make([]offload.Key, 0, len(keys)-1), keys[:i]...)
			}
			continue
		}
		if first != nil {
			loaded = append(loaded, keys[i])
		}
	}
	if first == nil {
		return keys, nil
	}
	if len(loaded) == 0 {
		loaded = nil
	}
	return loaded, first
}
