package remote

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

var (
	errTransient = errors.New("connection refused")
	errAnswered  = errors.New("access denied")
)

func testRetrier(t *testing.T, threshold int, timeout, backoff time.Duration) (*Retrier, *Health) {
	t.Helper()
	h := NewHealth("t", func(context.Context) error { return errors.New("still down") },
		HealthOptions{Threshold: threshold, Interval: time.Hour, Logger: slog.New(slog.DiscardHandler)})
	t.Cleanup(h.Close)
	return &Retrier{
		Timeout: timeout, Backoff: backoff, Health: h, Counters: new(Counters),
		Classify: func(err error) Class {
			if errors.Is(err, errAnswered) {
				return Answered
			}
			return Transient
		},
	}, h
}

// TestRetrier: transient failures are retried with growing pauses up to
// the limit, answers are not, timeouts are counted, and retrying stops
// as soon as the failures mark the server down.
func TestRetrier(t *testing.T) {
	t.Run("transient retried with backoff", func(t *testing.T) {
		r, h := testRetrier(t, 10, time.Second, 10*time.Millisecond)
		var calls []time.Time
		err := r.Do(context.Background(), 3, func(context.Context) error {
			calls = append(calls, time.Now())
			if len(calls) < 3 {
				return errTransient
			}
			return nil
		})
		if err != nil || len(calls) != 3 || r.Counters.Retries.Load() != 2 {
			t.Fatalf("err %v, %d calls, %d retries; want success on the third call", err, len(calls), r.Counters.Retries.Load())
		}
		// Backoff(10ms, 1) >= 10ms, Backoff(10ms, 2) >= 20ms: lower bounds only.
		if d1, d2 := calls[1].Sub(calls[0]), calls[2].Sub(calls[1]); d1 < 10*time.Millisecond || d2 < 20*time.Millisecond {
			t.Fatalf("pauses %v, %v; want >= 10ms, >= 20ms", d1, d2)
		}
		if !h.Healthy() || h.fails.Load() != 0 {
			t.Fatalf("healthy %v, failure streak %d after a success", h.Healthy(), h.fails.Load())
		}
	})
	t.Run("gives up after retries", func(t *testing.T) {
		r, _ := testRetrier(t, 10, time.Second, time.Millisecond)
		calls := 0
		err := r.Do(context.Background(), 2, func(context.Context) error { calls++; return errTransient })
		if !errors.Is(err, errTransient) || calls != 3 {
			t.Fatalf("err %v after %d calls; want the last error after 3", err, calls)
		}
	})
	t.Run("answers are not retried", func(t *testing.T) {
		r, h := testRetrier(t, 1, time.Second, time.Millisecond)
		calls := 0
		err := r.Do(context.Background(), 5, func(context.Context) error { calls++; return errAnswered })
		if !errors.Is(err, errAnswered) || calls != 1 || r.Counters.Retries.Load() != 0 || !h.Healthy() {
			t.Fatalf("err %v, %d calls, healthy %v; want one call, server up", err, calls, h.Healthy())
		}
	})
	t.Run("attempt timeout", func(t *testing.T) {
		r, _ := testRetrier(t, 10, 20*time.Millisecond, time.Millisecond)
		calls := 0
		err := r.Do(context.Background(), 1, func(ctx context.Context) error {
			calls++
			<-ctx.Done()
			return ctx.Err()
		})
		if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "timed out after 20ms") ||
			calls != 2 || r.Counters.Timeouts.Load() != 2 {
			t.Fatalf("err %v, %d calls, %d timeouts; want two timed-out attempts", err, calls, r.Counters.Timeouts.Load())
		}
	})
	t.Run("stops when marked down", func(t *testing.T) {
		r, h := testRetrier(t, 2, time.Second, time.Millisecond)
		calls := 0
		err := r.Do(context.Background(), 10, func(context.Context) error { calls++; return errTransient })
		if !errors.Is(err, errTransient) || calls != 2 || h.Healthy() {
			t.Fatalf("err %v after %d calls, healthy %v; want to stop at the threshold (2)", err, calls, h.Healthy())
		}
	})
	t.Run("refused at once while down", func(t *testing.T) {
		r, h := testRetrier(t, 1, time.Second, time.Millisecond)
		h.Failure(errTransient)
		calls := 0
		err := r.Do(context.Background(), 3, func(context.Context) error { calls++; return nil })
		if !errors.Is(err, ErrUnavailable) || calls != 0 {
			t.Fatalf("err %v after %d calls; want ErrUnavailable without calling the server", err, calls)
		}
	})
	t.Run("caller cancel is not the server's fault", func(t *testing.T) {
		r, h := testRetrier(t, 1, time.Second, time.Millisecond)
		ctx, cancel := context.WithCancel(context.Background())
		err := r.Do(ctx, 3, func(context.Context) error { cancel(); return errTransient })
		if !errors.Is(err, context.Canceled) || !h.Healthy() || h.fails.Load() != 0 {
			t.Fatalf("err %v, healthy %v, streak %d", err, h.Healthy(), h.fails.Load())
		}
	})
}

// TestForEachBound: concurrent ForEach calls sharing a semaphore never
// run more than its capacity at once (the tiers' bounded worker pool),
// and every index is called once.
func TestForEachBound(t *testing.T) {
	const limit, n = 3, 40
	sem := make(chan struct{}, limit)
	var cur, peak atomic.Int32
	var seen [2][n]atomic.Int32
	var wg sync.WaitGroup
	for g := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs := ForEach(context.Background(), sem, n, func(_ context.Context, i int) error {
				c := cur.Add(1)
				for p := peak.Load(); c > p && !peak.CompareAndSwap(p, c); p = peak.Load() {
				}
				seen[g][i].Add(1)
				time.Sleep(time.Millisecond)
				cur.Add(-1)
				return nil
			})
			for i, err := range errs {
				if err != nil {
					t.Errorf("call %d: %v", i, err)
				}
			}
		}()
	}
	wg.Wait()
	if p := peak.Load(); p > limit || p < 2 {
		t.Fatalf("peak concurrency %d, want 2..%d", p, limit)
	}
	for g := range seen {
		for i := range seen[g] {
			if c := seen[g][i].Load(); c != 1 {
				t.Fatalf("ForEach %d called index %d %d times", g, i, c)
			}
		}
	}
}
