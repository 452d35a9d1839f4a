package remote

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"
)

// Class says how an operation's error affects retries and health.
type Class uint8

const (
	// Transient: no usable answer (connection refused or reset, timeout,
	// server overloaded or failing). Counted against health and retried.
	Transient Class = iota
	// Answered: the server answered with a definite result (not found,
	// access denied, bad data). Proves the server is up; never retried.
	Answered
)

// Gate is the health a Retrier consults and reports to: a *Health, or
// one node's of a clustered server.
type Gate interface {
	Healthy() bool
	Success()
	Failure(err error)
}

// Retrier runs operations with a per-attempt timeout, retrying transient
// failures with exponential backoff while the server is considered up,
// and reports every outcome to Health. Safe for concurrent use.
type Retrier struct {
	Timeout  time.Duration // per attempt
	Backoff  time.Duration // base of the exponential backoff
	Health   Gate
	Counters *Counters
	// Classify maps an error that is not the caller's context ending to
	// a Class.
	Classify func(error) Class

	jitter atomic.Uint64
}

// Do runs op at most retries+1 times. It stops early when ctx ends or the
// server is marked down, and returns the last error (timeouts say so).
// While the server is down it fails at once with ErrUnavailable, without
// calling op: work already running when the server went down (the rest
// of a batch of existence checks, the other blocks of a job) then ends
// at once instead of waiting out a timeout per request.
func (r *Retrier) Do(ctx context.Context, retries int, op func(ctx context.Context) error) error {
	if !r.Health.Healthy() {
		return ErrUnavailable
	}
	for attempt := 0; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, r.Timeout)
		err := op(actx)
		timedOut := ctx.Err() == nil && errors.Is(actx.Err(), context.DeadlineExceeded)
		cancel()
		if err == nil {
			r.Health.Success()
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%w (%w)", ctx.Err(), err)
		}
		if !timedOut && r.Classify(err) == Answered {
			r.Health.Success()
			return err
		}
		if timedOut {
			r.Counters.Timeouts.Add(1)
			err = fmt.Errorf("timed out after %v: %w", r.Timeout, err)
		}
		r.Health.Failure(err)
		if attempt >= retries || !r.Health.Healthy() {
			return err
		}
		r.Counters.Retries.Add(1)
		if !Sleep(ctx, Backoff(r.Backoff, attempt+1, r.jitter.Add(1))) {
			return err
		}
	}
}
