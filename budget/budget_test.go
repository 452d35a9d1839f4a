package budget

import (
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
)

func mustNew(t *testing.T, total, share int64) *Budget {
	t.Helper()
	b, err := New(total, share, 0)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestNewRefusesNoTotal(t *testing.T) {
	if _, err := New(0, 0, 0); err == nil {
		t.Fatal("a zero total was accepted")
	}
	b := mustNew(t, 10, 0)
	if b.Share() != 10 {
		t.Fatalf("share %d, want the total", b.Share())
	}
}

func TestWaitersAreBounded(t *testing.T) {
	b, err := New(1, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	r, _ := b.Acquire(context.Background(), "a", 1)
	done := make(chan error, 1)
	go func() {
		g, err := b.Acquire(context.Background(), "a", 1)
		if err == nil {
			g.Release()
		}
		done <- err
	}()
	waitFor(t, func() bool { return b.Waiting() == 1 })
	if _, err := b.Acquire(context.Background(), "b", 1); !errors.Is(err, ErrBusy) {
		t.Fatalf("err %v, want ErrBusy", err)
	}
	r.Release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestTooLargeIsRefusedAtOnce(t *testing.T) {
	b := mustNew(t, 10, 4)
	if _, err := b.Acquire(context.Background(), "a", 5); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("err %v, want ErrTooLarge", err)
	}
}

// A holder at its share waits; another holder is granted meanwhile.
func TestShareKeepsOthersServed(t *testing.T) {
	b := mustNew(t, 10, 5)
	ctx := context.Background()
	r1, _ := b.Acquire(ctx, "a", 5)
	got := make(chan Grant, 1)
	go func() {
		r, err := b.Acquire(ctx, "a", 1)
		if err != nil {
			t.Error(err)
		}
		got <- r
	}()
	waitFor(t, func() bool { return b.Waiting() == 1 })
	r2, err := b.Acquire(ctx, "b", 5)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-got:
		t.Fatal("a was granted beyond its share")
	default:
	}
	r1.Release()
	r3 := <-got
	if u := b.Used(); u != 6 {
		t.Fatalf("used %d, want 6", u)
	}
	r2.Release()
	r3.Release()
	if u := b.Used(); u != 0 {
		t.Fatalf("used %d after every release", u)
	}
}

func TestCancelledWaiterHoldsNothing(t *testing.T) {
	b := mustNew(t, 4, 0)
	r, _ := b.Acquire(context.Background(), "a", 4)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := b.Acquire(ctx, "b", 2)
		done <- err
	}()
	waitFor(t, func() bool { return b.Waiting() == 1 })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want Canceled", err)
	}
	r.Release()
	if u, w := b.Used(), b.Waiting(); u != 0 || w != 0 {
		t.Fatalf("used %d, waiting %d after a cancelled wait", u, w)
	}
}

// TestModel runs random holders acquiring, releasing and giving up, and
// checks the bounds at every grant and that everything comes back.
func TestModel(t *testing.T) {
	for seed := range uint64(40) {
		rng := rand.New(rand.NewPCG(seed, 7))
		total := 1 + rng.Int64N(64)
		share := 1 + rng.Int64N(total)
		b := mustNew(t, total, share)
		var mu sync.Mutex
		held := map[string]int64{}
		var used int64
		check := func(h string, n int64) {
			mu.Lock()
			defer mu.Unlock()
			used += n
			held[h] += n
			if used > total || held[h] > share {
				t.Errorf("seed %d: used %d of %d, %s holds %d of %d", seed, used, total, h, held[h], share)
			}
		}
		var wg sync.WaitGroup
		for g := range 8 {
			r := rand.New(rand.NewPCG(seed, uint64(g)))
			wg.Add(1)
			go func() {
				defer wg.Done()
				h := string(rune('a' + r.IntN(3)))
				for range 200 {
					n := 1 + r.Int64N(share)
					ctx, cancel := context.WithCancel(context.Background())
					if r.IntN(4) == 0 {
						cancel() // some give up before or while they wait
					}
					rel, err := b.Acquire(ctx, h, n)
					cancel()
					if err != nil {
						continue
					}
					check(h, n)
					check(h, -n)
					rel.Release()
				}
			}()
		}
		wg.Wait()
		if u, w := b.Used(), b.Waiting(); u != 0 || w != 0 {
			t.Fatalf("seed %d: used %d, waiting %d at the end", seed, u, w)
		}
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for !cond() {
		if t.Context().Err() != nil {
			t.Fatal("condition never held")
		}
		runtime.Gosched()
	}
}
