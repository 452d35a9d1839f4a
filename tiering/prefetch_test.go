package tiering

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/kvtier/kvtier/offload"
)

func withPrefetch(pc PrefetchConfig) func(*Config) {
	return func(c *Config) { c.Prefetch = pc }
}

// fakeClock is a settable clock for deadlines.
type fakeClock struct{ now time.Time }

func (c *fakeClock) Now() time.Time { return c.now }

func TestPrefetchLandsBeforeTheEngineAsks(t *testing.T) {
	f := newFixture(t, withPrefetch(PrefetchConfig{Share: 1}))
	for _, k := range keyRange(0, 4) {
		f.t2.blocks[k] = true
	}
	pre := reqWith("prefetch#1", nil, nil)
	a, err := f.m.Prefetch(keyRange(0, 4), pre, time.Now().Add(time.Hour))
	if err != nil || a.Started != 4 || a.Present != 0 || a.Queued {
		t.Fatalf("prefetch: %+v %v", a, err)
	}
	if len(f.t2.loads) != 1 {
		t.Fatalf("the prefetch's promotion was not submitted at once: %d loads", len(f.t2.loads))
	}
	f.step()
	// The engine's lookups, in the step that asks: all Hit.
	if got := f.lookups(f.ctx, keyRange(0, 4)); !slices.Equal(got, rs(offload.Hit, offload.Hit, offload.Hit, offload.Hit)) {
		t.Fatalf("engine lookups after a prefetch: %v", got)
	}
	st := f.m.PrefetchStats()
	if st.Started != 1 || st.Completed != 1 || st.Promotions != 4 || st.InFlight != 0 || st.Queued != 0 {
		t.Fatalf("stats %+v", st)
	}
	// Idempotent: again, nothing to do.
	a, err = f.m.Prefetch(keyRange(0, 4), reqWith("prefetch#2", nil, nil), time.Now().Add(time.Hour))
	if err != nil || a.Started != 0 || a.Present != 4 || len(f.t2.loads) != 1 {
		t.Fatalf("second prefetch: %+v %v, %d loads", a, err, len(f.t2.loads))
	}
}

func TestPrefetchShareBoundsSlotsInFlight(t *testing.T) {
	// 5 slots, share 0.4: two prefetch promotions in flight or landed and
	// not yet read, at most.
	f := newFixture(t, withPrefetch(PrefetchConfig{Share: 0.4}))
	f.t2.hold = true
	for _, k := range keyRange(0, 5) {
		f.t2.blocks[k] = true
	}
	a, err := f.m.Prefetch(keyRange(0, 5), reqWith("p", nil, nil), time.Now().Add(time.Hour))
	if err != nil || a.Started != 2 || !a.Queued {
		t.Fatalf("prefetch: %+v %v", a, err)
	}
	for round := 0; round < 8; round++ {
		f.step()
		if st := f.m.PrefetchStats(); st.InFlight > 2 {
			t.Fatalf("round %d: %d slots in flight or held, share allows 2", round, st.InFlight)
		}
		f.t2.release()
		f.step()
		// The engine reads what landed: its lookups release the holds.
		for _, k := range keyRange(0, 5) {
			if f.p.Lookup(k) == offload.Hit {
				f.m.Lookup(k, f.ctx)
			}
		}
	}
	st := f.m.PrefetchStats()
	if st.Promotions != 5 || st.Completed != 1 || st.InFlight != 0 || st.Queued != 0 {
		t.Fatalf("stats %+v", st)
	}
	for _, k := range keyRange(0, 5) {
		if f.ref(k) != 0 {
			t.Errorf("%v: ref %d after the prefetch landed and was read", k, f.ref(k))
		}
	}
}

func TestPrefetchedBlocksWaitForTheirRequest(t *testing.T) {
	clk := &fakeClock{now: time.Unix(1000, 0)}
	f := newFixture(t, withPrefetch(PrefetchConfig{Share: 1, Now: clk.Now}))
	for _, k := range keyRange(0, 3) {
		f.t2.blocks[k] = true
	}
	if _, err := f.m.Prefetch(keyRange(0, 3), reqWith("p", nil, nil), clk.now.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	f.step()
	f.step()
	for _, k := range keyRange(0, 3) {
		if f.ref(k) != 1 {
			t.Fatalf("%v landed without its hold (ref %d)", k, f.ref(k))
		}
	}
	// The engine finds K0: its hold goes, the engine's own pin takes over.
	if r := f.m.Lookup(K(0), f.ctx); r != offload.Hit || f.ref(K(0)) != 0 {
		t.Fatalf("lookup of a held block: %v, ref %d", r, f.ref(K(0)))
	}
	// K1's and K2's go at the deadline.
	clk.now = clk.now.Add(2 * time.Second)
	f.step()
	if f.ref(K(1)) != 0 || f.ref(K(2)) != 0 {
		t.Fatalf("after the deadline: refs %d %d", f.ref(K(1)), f.ref(K(2)))
	}
	f.t2.blocks[K(3)], f.t2.blocks[K(4)] = true, true
	if _, err := f.m.Prefetch(keyRange(3, 5), reqWith("q", nil, nil), clk.now.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	f.step()
	f.step()
	// The engine's stores need every slot: the holds give way.
	f.m.OnNewRequest(f.ctx)
	out, ok, err := f.m.PrepareStore(keyRange(10, 15), f.ctx)
	if err != nil || !ok || len(out.KeysToStore) != 5 {
		t.Fatalf("a store that needs every slot: ok %v, %d stored, %v", ok, len(out.KeysToStore), err)
	}
	_ = f.m.CompleteStore(out.KeysToStore, f.ctx, true)
	if st := f.m.PrefetchStats(); st.Yielded != 2 || st.InFlight != 0 {
		t.Fatalf("stats after the engine's store: %+v", st)
	}
}

func TestPrefetchWaitsForUnsureTiersUntilItsDeadline(t *testing.T) {
	clk := &fakeClock{now: time.Unix(1000, 0)}
	f := newFixture(t, withPrefetch(PrefetchConfig{Share: 1, Now: clk.Now}))
	f.t1.retry, f.t2.retry = true, true
	a, err := f.m.Prefetch(keyRange(0, 2), reqWith("p1", nil, nil), clk.now.Add(time.Second))
	if err != nil || a.Started != 0 || !a.Queued {
		t.Fatalf("prefetch: %+v %v", a, err)
	}
	if !f.m.HasPendingWork() {
		t.Fatal("a waiting prefetch must keep steps coming")
	}
	f.step()
	// The tier's existence check answers: the next step promotes.
	f.t2.blocks[K(0)], f.t2.blocks[K(1)] = true, true
	f.step()
	if st := f.m.PrefetchStats(); st.Promotions != 2 || st.Completed != 1 {
		t.Fatalf("after the tier answered: %+v", st)
	}
	// Another that never resolves expires at its deadline.
	if _, err := f.m.Prefetch([]offload.Key{K(9)}, reqWith("p2", nil, nil), clk.now.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	f.step()
	if st := f.m.PrefetchStats(); st.Queued != 1 || st.Expired != 0 {
		t.Fatalf("before the deadline: %+v", st)
	}
	clk.now = clk.now.Add(2 * time.Second)
	f.step()
	if st := f.m.PrefetchStats(); st.Queued != 0 || st.Expired != 1 {
		t.Fatalf("after the deadline: %+v", st)
	}
}

func TestPrefetchRunEndsAtAMissAndHonoursTheFilter(t *testing.T) {
	f := newFixture(t, withPrefetch(PrefetchConfig{Share: 1}))
	f.t2.blocks[K(0)], f.t2.blocks[K(1)], f.t2.blocks[K(3)] = true, true, true
	a, err := f.m.Prefetch(keyRange(0, 4), reqWith("p", nil, nil), time.Now().Add(time.Hour))
	if err != nil || a.Started != 2 || a.Queued {
		t.Fatalf("prefetch: %+v %v", a, err)
	}
	// A filter that allows no secondary tier: nothing is asked.
	asked := len(f.t2.lookups)
	none := offload.NewTierFilter()
	a, err = f.m.Prefetch([]offload.Key{K(3)}, reqWith("q", none, nil), time.Now().Add(time.Hour))
	if err != nil || a.Started != 0 || a.Queued || len(f.t2.lookups) != asked {
		t.Fatalf("filtered prefetch: %+v %v, tier asked %d times", a, err, len(f.t2.lookups)-asked)
	}
}

func TestPrefetchNeverEvictsPinnedBlocks(t *testing.T) {
	f := newFixture(t, withPrefetch(PrefetchConfig{Share: 1}))
	held := keyRange(0, 5)
	f.m.OnNewRequest(f.ctx)
	f.store(f.ctx, held)
	if _, err := f.m.PrepareLoad(held, f.ctx); err != nil {
		t.Fatal(err)
	}
	f.t2.blocks[K(10)] = true
	a, err := f.m.Prefetch([]offload.Key{K(10)}, reqWith("p", nil, nil), time.Now().Add(time.Hour))
	if err != nil || a.Started != 0 || !a.Queued {
		t.Fatalf("prefetch into a pinned primary: %+v %v", a, err)
	}
	for _, k := range held {
		if f.ref(k) < 1 {
			t.Fatalf("%v lost its pin: ref %d", k, f.ref(k))
		}
	}
	if err := f.m.CompleteLoad(held, f.ctx); err != nil {
		t.Fatal(err)
	}
	f.step()
	f.step()
	if st := f.m.PrefetchStats(); st.Promotions != 1 || st.Completed != 1 {
		t.Fatalf("after the pins went: %+v", st)
	}
}

func TestPrefetchRefusals(t *testing.T) {
	f := newFixture(t, withPrefetch(PrefetchConfig{Share: -1}))
	if _, err := f.m.Prefetch(keyRange(0, 1), reqWith("p", nil, nil), time.Now()); !errors.Is(err, ErrPrefetchRefused) {
		t.Fatalf("prefetch off: %v", err)
	}
	g := newFixture(t, withPrefetch(PrefetchConfig{Share: 1, MaxQueued: 1}))
	g.t1.retry = true
	if _, err := g.m.Prefetch(keyRange(0, 1), reqWith("p", nil, nil), time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, err := g.m.Prefetch(keyRange(1, 2), reqWith("q", nil, nil), time.Now().Add(time.Hour)); !errors.Is(err, ErrPrefetchRefused) {
		t.Fatalf("queue full: %v", err)
	}
	if st := g.m.PrefetchStats(); st.Refused != 1 || st.Started != 1 {
		t.Fatalf("stats %+v", st)
	}
	// A reset forgets what waits and what is in flight.
	if err := g.m.Reset(t.Context()); err != nil {
		t.Fatal(err)
	}
	if st := g.m.PrefetchStats(); st.Queued != 0 || st.InFlight != 0 {
		t.Fatalf("after a reset: %+v", st)
	}
}
