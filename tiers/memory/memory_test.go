package memory

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
	"pgregory.net/rapid"

	"github.com/kvtier/kvtier/offload"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testArena is a plain byte-slice arena.
type testArena struct {
	slotSize int
	buf      []byte
}

func newArena(slots, slotSize int) *testArena {
	return &testArena{slotSize: slotSize, buf: make([]byte, slots*slotSize)}
}

func (a *testArena) SlotSize() int { return a.slotSize }
func (a *testArena) NumSlots() int { return len(a.buf) / a.slotSize }
func (a *testArena) Slot(i int64) ([]byte, error) {
	if i < 0 || i >= int64(a.NumSlots()) {
		return nil, fmt.Errorf("slot %d: %w", i, offload.ErrSlotOutOfRange)
	}
	return a.buf[int(i)*a.slotSize : int(i+1)*a.slotSize], nil
}

func (a *testArena) fill(slot int64, seed byte) {
	b, _ := a.Slot(slot)
	for i := range b {
		b[i] = seed + byte(i)
	}
}

func K(n int) offload.Key { return offload.MakeKey([]byte(fmt.Sprint(n)), 0) }

func keys(ns ...int) []offload.Key {
	out := make([]offload.Key, len(ns))
	for i, n := range ns {
		out[i] = K(n)
	}
	return out
}

func mustNew(t *testing.T, cfg Config) *Tier {
	t.Helper()
	tier, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tier.Close(context.Background()) })
	return tier
}

// collect polls FinishedJobs until want results arrived (or a timeout).
func collect(t *testing.T, tier *Tier, want int) []offload.JobResult {
	t.Helper()
	var got []offload.JobResult
	deadline := time.Now().Add(5 * time.Second)
	for len(got) < want && time.Now().Before(deadline) {
		got = append(got, tier.FinishedJobs()...)
		if len(got) < want {
			time.Sleep(time.Millisecond)
		}
	}
	if len(got) != want {
		t.Fatalf("got %d results, want %d: %+v", len(got), want, got)
	}
	if extra := tier.FinishedJobs(); len(extra) != 0 {
		t.Fatalf("extra results: %+v", extra)
	}
	return got
}

func store(tier *Tier, a offload.Arena, id uint64, ks []offload.Key, slots ...int64) {
	tier.SubmitStore(&offload.Job{ID: id, Keys: ks, Slots: slots, Arena: a, Req: offload.Background("r")})
}

// Case 36: empty ⇒ MISS; after storing K0,K1 ⇒ HIT,HIT; K2 ⇒ MISS.
func TestLookupAfterStore(t *testing.T) {
	tier := mustNew(t, Config{Medium: offload.MediumCPU})
	req := offload.Background("r")
	if got := tier.Lookup(K(0), req); got != offload.Miss {
		t.Fatalf("empty lookup = %v", got)
	}
	a := newArena(4, 8)
	store(tier, a, 1, keys(0, 1), 0, 1)
	res := collect(t, tier, 1)
	if !res[0].Success || res[0].JobID != 1 || res[0].Bytes != 16 {
		t.Fatalf("result %+v", res[0])
	}
	for i, want := range []offload.LookupResult{offload.Hit, offload.Hit, offload.Miss} {
		if got := tier.Lookup(K(i), req); got != want {
			t.Errorf("lookup K%d = %v, want %v", i, got, want)
		}
	}
	if tier.Type() != "memory" || tier.Name() != "memory" || tier.Medium() != offload.MediumCPU || tier.Locality() != offload.LocalityUnspecified {
		t.Errorf("declarations: %s %s %v %v", tier.Type(), tier.Name(), tier.Medium(), tier.Locality())
	}
}

func TestRoundTripBytes(t *testing.T) {
	for _, latency := range []time.Duration{0, 2 * time.Millisecond} {
		for _, n := range []int{0, 1, 2, 5} {
			t.Run(fmt.Sprintf("latency=%v/n=%d", latency, n), func(t *testing.T) {
				tier := mustNew(t, Config{Latency: latency})
				src := newArena(8, 64)
				dst := newArena(8, 64)
				ks := make([]offload.Key, n)
				slots := make([]int64, n)
				back := make([]int64, n)
				for i := range n {
					ks[i] = K(i)
					slots[i] = int64(i)
					back[i] = int64(7 - i)
					src.fill(int64(i), byte(10*i+1))
				}
				store(tier, src, 1, ks, slots...)
				if r := collect(t, tier, 1)[0]; !r.Success {
					t.Fatalf("store: %+v", r)
				}
				tier.SubmitLoad(&offload.Job{ID: 2, Keys: ks, Slots: back, Promotion: true, Arena: dst})
				r := collect(t, tier, 1)[0]
				if !r.Success || r.JobID != 2 || r.Bytes != int64(64*n) {
					t.Fatalf("load: %+v", r)
				}
				for i := range n {
					want, _ := src.Slot(int64(i))
					got, _ := dst.Slot(back[i])
					if !bytes.Equal(want, got) {
						t.Fatalf("block %d differs", i)
					}
				}
			})
		}
	}
}

// A store copies the bytes at submit (or completion) time: later changes to
// the arena slot do not change the stored block.
func TestStoreCopies(t *testing.T) {
	tier := mustNew(t, Config{})
	a := newArena(2, 4)
	a.fill(0, 1)
	store(tier, a, 1, keys(0), 0)
	collect(t, tier, 1)
	a.fill(0, 100)
	got, _ := tier.Get(K(0))
	if !bytes.Equal(got, []byte{1, 2, 3, 4}) {
		t.Fatalf("stored %v", got)
	}
}

func TestLoadMissingReportsPrefixAndMarksMiss(t *testing.T) {
	tier := mustNew(t, Config{})
	a := newArena(4, 4)
	store(tier, a, 1, keys(0, 1), 0, 1)
	collect(t, tier, 1)
	req := &offload.ReqContext{ID: "a"}
	other := &offload.ReqContext{ID: "b"}
	tier.OnNewRequest(req)
	tier.OnNewRequest(other)
	tier.SubmitLoad(&offload.Job{ID: 2, Keys: keys(0, 1, 2), Slots: []int64{0, 1, 2}, Promotion: true, Arena: a, Req: req})
	r := collect(t, tier, 1)[0]
	if r.Success || !errors.Is(r.Err, ErrNotPresent) {
		t.Fatalf("result %+v", r)
	}
	if diff := cmp.Diff(keys(0, 1), r.SuccessfulKeys); diff != "" {
		t.Fatalf("successful keys (-want +got):\n%s", diff)
	}

	// First key missing: no successful keys; that key is a MISS for the
	// request from now on even once stored, while other requests see it.
	tier.SubmitLoad(&offload.Job{ID: 3, Keys: keys(3, 0), Slots: []int64{0, 1}, Promotion: true, Arena: a, Req: req})
	r = collect(t, tier, 1)[0]
	if r.Success || r.SuccessfulKeys != nil {
		t.Fatalf("result %+v", r)
	}
	store(tier, a, 4, keys(3), 3)
	collect(t, tier, 1)
	if got := tier.Lookup(K(3), req); got != offload.Miss {
		t.Errorf("failed key for same request = %v, want MISS", got)
	}
	if got := tier.Lookup(K(3), other); got != offload.Hit {
		t.Errorf("failed key for other request = %v, want HIT", got)
	}
	tier.OnRequestFinished(req)
	if got := tier.Lookup(K(3), req); got != offload.Hit {
		t.Errorf("after finish = %v, want HIT", got)
	}
}

func TestOutOfRangeSlot(t *testing.T) {
	tier := mustNew(t, Config{})
	a := newArena(2, 4)
	store(tier, a, 1, keys(0, 1), 0, 5)
	if r := collect(t, tier, 1)[0]; r.Success || !errors.Is(r.Err, offload.ErrSlotOutOfRange) {
		t.Fatalf("store: %+v", r)
	}
	if tier.Len() != 0 {
		t.Fatalf("a failed store stored %d blocks", tier.Len())
	}
	store(tier, a, 2, keys(0), 0)
	collect(t, tier, 1)
	tier.SubmitLoad(&offload.Job{ID: 3, Keys: keys(0), Slots: []int64{-1}, Arena: a})
	if r := collect(t, tier, 1)[0]; r.Success || !errors.Is(r.Err, offload.ErrSlotOutOfRange) {
		t.Fatalf("load: %+v", r)
	}
	tier.SubmitStore(&offload.Job{ID: 4, Keys: keys(0), Slots: nil, Arena: a})
	if r := collect(t, tier, 1)[0]; r.Success {
		t.Fatalf("mismatched keys/slots succeeded: %+v", r)
	}
}

func TestCapacityEvictsLRUWithEvents(t *testing.T) {
	tier := mustNew(t, Config{Name: "m", Medium: offload.MediumStorage, Locality: offload.LocalityLocal, CapacityBlocks: 3, Events: true})
	a := newArena(8, 4)
	store(tier, a, 1, keys(0, 1, 2), 0, 1, 2)
	collect(t, tier, 1)
	tier.Touch(keys(0), nil) // 1 is now the oldest
	store(tier, a, 2, keys(3, 4), 3, 4)
	collect(t, tier, 1)
	for i, want := range []bool{true, false, false, true, true} {
		if got := tier.Contains(K(i)); got != want {
			t.Errorf("contains K%d = %v, want %v", i, got, want)
		}
	}
	want := []offload.Event{
		{Keys: keys(0, 1, 2), Medium: offload.MediumStorage, Locality: offload.LocalityLocal, Tier: "m"},
		{Keys: keys(1, 2), Medium: offload.MediumStorage, Locality: offload.LocalityLocal, Removed: true, Tier: "m"},
		{Keys: keys(3, 4), Medium: offload.MediumStorage, Locality: offload.LocalityLocal, Tier: "m"},
	}
	// One removal per store job, announced before the store that reuses the room.
	if diff := cmp.Diff(want, tier.TakeEvents()); diff != "" {
		t.Fatalf("events (-want +got):\n%s", diff)
	}
	if ev := tier.TakeEvents(); ev != nil {
		t.Fatalf("TakeEvents did not drain: %v", ev)
	}
}

// flatten renders events as strings, merging consecutive stored events of
// the same kind so tests do not depend on per-job batching.
func flatten(evs []offload.Event) []string {
	var out []string
	for _, e := range evs {
		kind := "stored"
		if e.Removed {
			kind = "removed"
		}
		for _, k := range e.Keys {
			out = append(out, fmt.Sprintf("%s %s %v %v %s", kind, k, e.Medium, e.Locality, e.Tier))
		}
	}
	return out
}

func TestNoEventsByDefault(t *testing.T) {
	tier := mustNew(t, Config{CapacityBlocks: 1})
	a := newArena(2, 4)
	store(tier, a, 1, keys(0), 0)
	store(tier, a, 2, keys(1), 1)
	collect(t, tier, 2)
	if ev := tier.TakeEvents(); len(ev) != 0 {
		t.Fatalf("events without Events: %v", ev)
	}
}

func TestStoreSkipsPresentBlocks(t *testing.T) {
	tier := mustNew(t, Config{Events: true})
	a := newArena(2, 4)
	store(tier, a, 1, keys(0), 0)
	store(tier, a, 2, keys(0, 1), 0, 1)
	res := collect(t, tier, 2)
	if res[1].Bytes != 4 {
		t.Fatalf("second store copied %d bytes, want 4", res[1].Bytes)
	}
	if diff := cmp.Diff([]string{"stored " + K(0).String() + "   memory", "stored " + K(1).String() + "   memory"}, flatten(tier.TakeEvents())); diff != "" {
		t.Fatal(diff)
	}
}

func TestFailureInjectionDeterministic(t *testing.T) {
	run := func() []bool {
		tier := mustNew(t, Config{FailRate: 0.5, Seed: 42})
		a := newArena(1, 4)
		var out []bool
		for i := range 64 {
			store(tier, a, uint64(i), keys(i), 0)
			r := collect(t, tier, 1)[0]
			if !r.Success && !errors.Is(r.Err, ErrInjected) {
				t.Fatalf("unexpected error %v", r.Err)
			}
			out = append(out, r.Success)
		}
		return out
	}
	a, b := run(), run()
	if diff := cmp.Diff(a, b); diff != "" {
		t.Fatalf("same seed, different failures:\n%s", diff)
	}
	fails := 0
	for _, ok := range a {
		if !ok {
			fails++
		}
	}
	if fails < 10 || fails > 54 {
		t.Fatalf("%d of 64 failed at rate 0.5", fails)
	}
}

func TestFailRateOneLoadPrefix(t *testing.T) {
	tier := mustNew(t, Config{Seed: 7})
	a := newArena(8, 4)
	store(tier, a, 1, keys(0, 1, 2, 3, 4, 5, 6, 7), 0, 1, 2, 3, 4, 5, 6, 7)
	collect(t, tier, 1)
	tier.cfg.FailRate = 1
	sawPartial := false
	for i := range 20 {
		ks := keys(0, 1, 2, 3, 4, 5, 6, 7)
		tier.SubmitLoad(&offload.Job{ID: uint64(10 + i), Keys: ks, Slots: []int64{0, 1, 2, 3, 4, 5, 6, 7}, Arena: a})
		r := collect(t, tier, 1)[0]
		if r.Success || !errors.Is(r.Err, ErrInjected) {
			t.Fatalf("result %+v", r)
		}
		if n := len(r.SuccessfulKeys); n > 0 {
			sawPartial = true
			if diff := cmp.Diff(ks[:n], r.SuccessfulKeys); diff != "" || r.Bytes != int64(4*n) {
				t.Fatalf("prefix %v bytes %d", r.SuccessfulKeys, r.Bytes)
			}
		}
	}
	if !sawPartial {
		t.Fatal("no partial load in 20 injected failures of 8-key jobs")
	}
}

func TestAsyncLookup(t *testing.T) {
	tier := mustNew(t, Config{AsyncLookup: true})
	a := newArena(2, 4)
	store(tier, a, 1, keys(0), 0)
	collect(t, tier, 1)
	req := &offload.ReqContext{ID: "a"}
	tier.OnNewRequest(req)
	for range 2 {
		if got := tier.Lookup(K(0), req); got != offload.Retry {
			t.Fatalf("first-step lookup = %v, want RETRY", got)
		}
	}
	if got := tier.Lookup(K(1), req); got != offload.Retry {
		t.Fatalf("first-step lookup of absent key = %v, want RETRY", got)
	}
	if !tier.HasPendingWork() {
		t.Fatal("queued lookups are pending work")
	}
	tier.OnScheduleEnd(offload.ScheduleEnd{})
	if tier.HasPendingWork() {
		t.Fatal("pending work after resolution")
	}
	if got := tier.Lookup(K(0), req); got != offload.Hit {
		t.Fatalf("resolved lookup = %v, want HIT", got)
	}
	if got := tier.Lookup(K(1), req); got != offload.Miss {
		t.Fatalf("resolved absent lookup = %v, want MISS", got)
	}
	other := &offload.ReqContext{ID: "b"}
	if got := tier.Lookup(K(0), other); got != offload.Retry {
		t.Fatalf("other request's first lookup = %v, want RETRY", got)
	}
	tier.OnRequestFinished(req)
	tier.OnRequestFinished(other)
	if len(tier.reqs) != 0 {
		t.Fatalf("request state left: %v", tier.reqs)
	}
}

func TestDrainHonoursContext(t *testing.T) {
	tier := mustNew(t, Config{Latency: time.Hour})
	a := newArena(1, 4)
	store(tier, a, 1, keys(0), 0)
	if !tier.HasPendingWork() {
		t.Fatal("job in flight is pending work")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if err := tier.DrainJobs(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("drain = %v, want deadline exceeded", err)
	}
	if r := tier.FinishedJobs(); len(r) != 0 {
		t.Fatalf("results before latency: %v", r)
	}
	// Close answers the outstanding job (failed) and later submissions.
	if err := tier.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	store(tier, a, 2, keys(1), 0)
	tier.SubmitLoad(&offload.Job{ID: 3, Keys: keys(0), Slots: []int64{0}, Arena: a})
	res := collect(t, tier, 3)
	ids := map[uint64]bool{}
	for _, r := range res {
		if r.Success || !errors.Is(r.Err, ErrClosed) {
			t.Errorf("result after close %+v", r)
		}
		ids[r.JobID] = true
	}
	if len(ids) != 3 {
		t.Fatalf("job ids %v", ids)
	}
	if got := tier.Lookup(K(0), nil); got != offload.Miss {
		t.Fatalf("lookup after close = %v", got)
	}
	if err := tier.Close(context.Background()); err != nil {
		t.Fatalf("second close: %v", err)
	}
}

func TestDrainWaitsForLatency(t *testing.T) {
	tier := mustNew(t, Config{Latency: 5 * time.Millisecond})
	a := newArena(4, 4)
	for i := range 4 {
		store(tier, a, uint64(i), keys(i), int64(i))
	}
	if err := tier.DrainJobs(context.Background()); err != nil {
		t.Fatal(err)
	}
	res := tier.FinishedJobs()
	if len(res) != 4 {
		t.Fatalf("after drain %d results, want 4", len(res))
	}
	for _, r := range res {
		if !r.Success || r.Duration < 5*time.Millisecond {
			t.Errorf("result %+v", r)
		}
	}
	if tier.HasPendingWork() {
		t.Fatal("pending work after drain and collect")
	}
}

func TestNewValidates(t *testing.T) {
	for _, cfg := range []Config{
		{CapacityBlocks: -1},
		{Latency: -time.Second},
		{FailRate: 1.5},
		{FailRate: -0.1},
		{Medium: 7},
		{Locality: 9},
	} {
		if _, err := New(cfg); err == nil {
			t.Errorf("New(%+v) succeeded", cfg)
		}
	}
}

func TestPutGet(t *testing.T) {
	tier := mustNew(t, Config{CapacityBlocks: 1, Events: true})
	tier.Put(K(0), []byte("abc"))
	tier.Put(K(1), []byte("def"))
	if _, ok := tier.Get(K(0)); ok {
		t.Fatal("K0 not evicted")
	}
	if b, ok := tier.Get(K(1)); !ok || string(b) != "def" {
		t.Fatalf("K1 = %q %v", b, ok)
	}
	if n := len(flatten(tier.TakeEvents())); n != 3 {
		t.Fatalf("%d events, want 3", n)
	}
}

// listLen walks the recency lists; they must always match the map, and
// each block sits in its owner's.
func (t *Tier) listLen() int {
	n := 0
	for o := range t.lrus {
		lru := &t.lrus[o]
		for e := lru.next; e != lru; e = e.next {
			if t.blocks[e.key] != e || int(e.owner) != o {
				return -1
			}
			n++
		}
	}
	return n
}

func TestStoreDuplicatesAndOversizedJobs(t *testing.T) {
	tier := mustNew(t, Config{CapacityBlocks: 2, Events: true})
	a := newArena(4, 4)
	for i := range 4 {
		a.fill(int64(i), byte(i*10))
	}
	store(tier, a, 1, keys(0, 0, 1), 0, 0, 1)
	store(tier, a, 2, keys(1, 2, 3), 1, 2, 3) // three keys, room for two
	store(tier, a, 3, keys(3, 0, 3), 3, 0, 3)
	collect(t, tier, 3)
	if n := tier.listLen(); n != tier.Len() || n > 2 {
		t.Fatalf("list %d, map %d", n, tier.Len())
	}
	for _, k := range keys(0, 1, 2, 3) {
		if b, ok := tier.Get(k); ok {
			i, _ := strconv.Atoi(k.Hash()) // K(n) hashes are decimal
			want, _ := a.Slot(int64(i))
			if !bytes.Equal(b, want) {
				t.Errorf("%v holds wrong bytes", k)
			}
		}
	}
}

// TestEventsTrackContents replays the tier's events in order, as a router
// does, and checks after every job that they describe exactly the blocks
// the tier holds — also when a job stores more new blocks than the
// capacity, so that it evicts blocks it stored itself.
func TestEventsTrackContents(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		capacity := rapid.IntRange(1, 4).Draw(rt, "capacity")
		tier, err := New(Config{CapacityBlocks: capacity, Events: true})
		if err != nil {
			rt.Fatal(err)
		}
		defer tier.Close(context.Background())
		a := newArena(8, 4)
		seen := map[offload.Key]bool{}
		jobs := rapid.IntRange(1, 8).Draw(rt, "jobs")
		for id := range jobs {
			ks := rapid.SliceOfN(rapid.IntRange(0, 6), 1, 8).Draw(rt, "keys")
			slots := make([]int64, len(ks))
			for i := range slots {
				slots[i] = int64(i)
			}
			if put := rapid.Bool().Draw(rt, "put"); put {
				tier.Put(K(ks[0]), []byte("abcd"))
			} else {
				store(tier, a, uint64(id), keys(ks...), slots...)
			}
			for _, ev := range tier.TakeEvents() {
				for _, k := range ev.Keys {
					seen[k] = !ev.Removed
				}
			}
			for n := range 7 {
				if held := tier.Contains(K(n)); held != seen[K(n)] {
					rt.Fatalf("after job %d (keys %v): tier holds %v = %v, events say %v", id, ks, K(n), held, seen[K(n)])
				}
			}
		}
		tier.FinishedJobs()
	})
}

// With Concurrency, jobs beyond it wait in a FIFO queue (QueueDepth bounds
// it: a job beyond is refused); a job waiting, or still waiting out its
// latency, can be withdrawn and is never answered nor copied.
func TestConcurrencyQueueAndCancel(t *testing.T) {
	tier := mustNew(t, Config{Name: "q", Latency: time.Hour, Concurrency: 1, QueueDepth: 2})
	a := newArena(8, 16)
	for i := range 4 {
		a.fill(int64(i), byte(i+1))
		store(tier, a, uint64(i+1), keys(i), int64(i))
	}
	if q, c := tier.QueuedJobs(); q != 2 || c != 2 {
		t.Fatalf("QueuedJobs = %d, %d; want 2 waiting of 2", q, c)
	}
	res := tier.FinishedJobs()
	if len(res) != 1 || res[0].JobID != 4 || !errors.Is(res[0].Err, offload.ErrRefused) {
		t.Fatalf("results %+v, want job 4 refused (queue full)", res)
	}
	// Job 1 is in service (its latency runs), 2 and 3 wait.
	for _, id := range []uint64{3, 1, 2} {
		if !tier.CancelQueued(id) {
			t.Fatalf("job %d not withdrawn", id)
		}
	}
	if tier.CancelQueued(1) || tier.CancelQueued(99) {
		t.Fatal("withdrew a job twice, or an unknown one")
	}
	if err := tier.DrainJobs(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := tier.FinishedJobs(); len(got) != 0 || tier.Len() != 0 || tier.HasPendingWork() {
		t.Fatalf("withdrawn jobs answered %+v, or stored %d blocks", got, tier.Len())
	}
}

// BlockLatency adds to a job's latency per block, and the job's reported
// duration runs from its submission.
func TestBlockLatency(t *testing.T) {
	tier := mustNew(t, Config{Name: "b", BlockLatency: 5 * time.Millisecond})
	a := newArena(4, 16)
	store(tier, a, 1, keys(1, 2, 3, 4), 0, 1, 2, 3)
	res := collect(t, tier, 1)
	if !res[0].Success || res[0].Duration < 20*time.Millisecond {
		t.Fatalf("result %+v, want success after at least 4 × 5ms", res[0])
	}
}

// The tier claims blocks (offload.BlockClaimer): a block taken back
// before the job copies it (here, before it is submitted) is neither
// stored nor announced; the job's other blocks are.
func TestStoreSkipsBlocksTakenBack(t *testing.T) {
	tier := mustNew(t, Config{Name: "b", Events: true})
	if !tier.ClaimsBlocks() {
		t.Fatal("the memory tier does not claim blocks")
	}
	a := newArena(3, 16)
	claims := offload.NewClaims(3)
	if !claims.Revoke(1) {
		t.Fatal("a block no tier reads could not be taken back")
	}
	tier.SubmitStore(&offload.Job{ID: 1, Keys: keys(1, 2, 3), Slots: []int64{0, 1, 2}, Arena: a, Req: offload.Background("r"), Claims: claims})
	if res := collect(t, tier, 1); !res[0].Success {
		t.Fatalf("store: %+v", res[0])
	}
	if !tier.Contains(K(1)) || tier.Contains(K(2)) || !tier.Contains(K(3)) {
		t.Fatalf("tier holds 1: %v, 2: %v, 3: %v; want 1 and 3", tier.Contains(K(1)), tier.Contains(K(2)), tier.Contains(K(3)))
	}
	if got := flatten(tier.TakeEvents()); len(got) != 2 || !strings.Contains(got[0], K(1).String()) || !strings.Contains(got[1], K(3).String()) {
		t.Fatalf("events %v, want 1 and 3 stored", got)
	}
}
