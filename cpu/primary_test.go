package cpu

import (
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kvtier/kvtier/offload"
)

const testSlotSize = 64

// key returns the test key of block i: an 8-byte big-endian hash in group 0.
func key(i int) offload.Key {
	var h [8]byte
	binary.BigEndian.PutUint64(h[:], uint64(i))
	return offload.MakeKey(h[:], 0)
}

func ks(ids ...int) []offload.Key {
	out := make([]offload.Key, len(ids))
	for i, id := range ids {
		out[i] = key(id)
	}
	return out
}

// ids maps keys back to block numbers for readable comparisons.
func ids(keys []offload.Key) []int {
	out := make([]int, len(keys))
	for i, k := range keys {
		out[i] = int(binary.BigEndian.Uint64([]byte(k.Hash())))
	}
	return out
}

func newPrimary(t testing.TB, slots int, policy string) *Primary {
	t.Helper()
	p, err := New(Config{SlotSize: testSlotSize, Capacity: int64(slots * testSlotSize), Policy: policy, Events: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// store runs PrepareStore and checks its output; wantKeys nil means the
// call must fail (None).
func store(t *testing.T, p *Primary, keys []int, wantKeys, wantSlots, wantEvicted []int) {
	t.Helper()
	out, ok := p.PrepareStore(ks(keys...))
	if wantKeys == nil {
		if ok {
			t.Fatalf("PrepareStore(%v) = %v %v evicted %v, want None", keys, ids(out.KeysToStore), out.Slots, ids(out.Evicted))
		}
		return
	}
	if !ok {
		t.Fatalf("PrepareStore(%v) = None", keys)
	}
	slots := make([]int, len(out.Slots))
	for i, s := range out.Slots {
		slots[i] = int(s)
	}
	got := [][]int{ids(out.KeysToStore), slots, ids(out.Evicted)}
	want := [][]int{wantKeys, wantSlots, wantEvicted}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("PrepareStore(%v) [keys slots evicted] (-want +got):\n%s", keys, diff)
	}
}

// storeOK prepares and completes a store that must succeed.
func storeOK(t *testing.T, p *Primary, keys ...int) offload.PrepareStoreOutput {
	t.Helper()
	out, ok := p.PrepareStore(ks(keys...))
	if !ok {
		t.Fatalf("PrepareStore(%v) = None", keys)
	}
	p.CompleteStore(ks(keys...), true)
	return out
}

func lookups(t *testing.T, p *Primary, want map[int]offload.LookupResult) {
	t.Helper()
	for id, w := range want {
		if got := p.Lookup(key(id)); got != w {
			t.Errorf("Lookup(%d) = %v, want %v", id, got, w)
		}
	}
}

type ev struct {
	Removed bool
	Keys    []int
}

func events(t *testing.T, p *Primary) []ev {
	t.Helper()
	var out []ev
	for _, e := range p.TakeEvents() {
		if e.Medium != offload.MediumCPU || e.Locality != offload.LocalityUnspecified || e.Tier != "" {
			t.Errorf("event %+v: want medium CPU, no locality, no tier", e)
		}
		out = append(out, ev{e.Removed, ids(e.Keys)})
	}
	return out
}

var policies = []string{PolicyLRU, PolicyARC}

// Case 37: a removed event precedes the stored event that reuses its slot.
func TestRemovedPrecedesStored(t *testing.T) {
	for _, pol := range policies {
		t.Run(pol, func(t *testing.T) {
			p := newPrimary(t, 2, pol)
			storeOK(t, p, 1, 2)
			p.TakeEvents()
			storeOK(t, p, 3)
			evs := events(t, p)
			lastRemoved, firstStored := -1, len(evs)
			for i, e := range evs {
				if e.Removed {
					lastRemoved = i
				} else if i < firstStored {
					firstStored = i
				}
			}
			if lastRemoved < 0 || firstStored == len(evs) || lastRemoved > firstStored {
				t.Fatalf("events %+v: want removals before stores", evs)
			}
		})
	}
}

// Case 38: a block requested again in a store call survives that call.
func TestAlreadyStoredNotEvicted(t *testing.T) {
	for _, pol := range policies {
		t.Run(pol, func(t *testing.T) {
			p := newPrimary(t, 4, pol)
			storeOK(t, p, 1, 2)
			p.Touch(ks(1))
			store(t, p, []int{2, 3, 4, 5}, []int{3, 4, 5}, []int{2, 3, 0}, []int{1})
			p.CompleteStore(ks(2, 3, 4, 5), true)
			lookups(t, p, map[int]offload.LookupResult{2: offload.Hit, 1: offload.Miss})
		})
	}
}

// Case 39: the full evictable-list LRU scenario.
func TestLRUScenario(t *testing.T) {
	p := newPrimary(t, 4, PolicyLRU)
	store(t, p, []int{1, 2}, []int{1, 2}, []int{0, 1}, []int{})
	lookups(t, p, map[int]offload.LookupResult{1: offload.HitPending, 2: offload.HitPending})
	if evs := events(t, p); len(evs) != 0 {
		t.Fatalf("events after prepare: %+v", evs)
	}
	p.CompleteStore(ks(1, 2), true)
	if diff := cmp.Diff([]ev{{false, []int{1, 2}}}, events(t, p)); diff != "" {
		t.Fatalf("events (-want +got):\n%s", diff)
	}
	lookups(t, p, map[int]offload.LookupResult{1: offload.Hit, 2: offload.Hit, 3: offload.Miss})

	store(t, p, []int{2, 3, 4, 5}, []int{3, 4, 5}, []int{2, 3, 0}, []int{1})
	if diff := cmp.Diff([]ev{{true, []int{1}}}, events(t, p)); diff != "" {
		t.Fatalf("events (-want +got):\n%s", diff)
	}
	store(t, p, []int{1, 6}, nil, nil, nil)
	p.CompleteStore(ks(2, 3, 4, 5), true)
	lookups(t, p, map[int]offload.LookupResult{1: offload.Miss, 2: offload.Hit, 3: offload.Hit, 4: offload.Hit, 5: offload.Hit, 0: offload.Miss})

	slots, err := p.PrepareLoad(ks(2, 3))
	if err != nil || !slices.Equal(slots, []int64{1, 2}) {
		t.Fatalf("PrepareLoad(2,3) = %v, %v; want [1 2]", slots, err)
	}
	store(t, p, []int{6, 7, 8}, nil, nil, nil)
	if err := p.CompleteLoad(ks(2, 3)); err != nil {
		t.Fatal(err)
	}
	store(t, p, []int{6, 7, 8}, []int{6, 7, 8}, []int{1, 0, 3}, []int{4, 5, 2})
	p.CompleteStore(ks(6, 7, 8), true)
	p.Touch(ks(3, 6, 7))
	store(t, p, []int{9}, []int{9}, []int{3}, []int{8})
	p.CompleteStore(ks(7, 9), false)
	lookups(t, p, map[int]offload.LookupResult{7: offload.Hit, 9: offload.Miss})
	want := []ev{{false, []int{3, 4, 5}}, {true, []int{4, 5, 2}}, {false, []int{6, 7, 8}}, {true, []int{8}}}
	if diff := cmp.Diff(want, events(t, p)); diff != "" {
		t.Fatalf("remaining events (-want +got):\n%s", diff)
	}
	checkInvariants(t, p)
}

// Case 40: PrepareLoad returns slots in the order of the requested keys.
func TestPrepareLoadKeyOrder(t *testing.T) {
	p := newPrimary(t, 4, PolicyLRU)
	storeOK(t, p, 1, 2, 3)
	slotOf := map[int]int64{}
	for _, id := range []int{1, 2, 3} {
		s, ok := p.SlotOf(key(id))
		if !ok {
			t.Fatalf("SlotOf(%d) missing", id)
		}
		slotOf[id] = s
	}
	for _, perm := range [][]int{{1, 2, 3}, {1, 3, 2}, {2, 1, 3}, {2, 3, 1}, {3, 1, 2}, {3, 2, 1}} {
		slots, err := p.PrepareLoad(ks(perm...))
		if err != nil {
			t.Fatal(err)
		}
		want := []int64{slotOf[perm[0]], slotOf[perm[1]], slotOf[perm[2]]}
		if !slices.Equal(slots, want) {
			t.Errorf("PrepareLoad(%v) = %v, want %v", perm, slots, want)
		}
		if err := p.CompleteLoad(ks(perm...)); err != nil {
			t.Fatal(err)
		}
	}
}

// PrepareLoadPresent pins what is readable and answers -1 for a key
// absent or still being written, pinning nothing for it.
func TestPrepareLoadPresent(t *testing.T) {
	p := newPrimary(t, 4, PolicyLRU)
	storeOK(t, p, 1, 2)
	if _, ok := p.PrepareStore(ks(3)); !ok { // 3 pending
		t.Fatal("no room for 3")
	}
	slots, missing := p.PrepareLoadPresent(ks(1, 9, 3, 2, 1))
	if missing != 2 || slots[1] != -1 || slots[2] != -1 || slots[0] < 0 || slots[3] < 0 || slots[4] != slots[0] {
		t.Fatalf("PrepareLoadPresent = %v, %d missing; want 9 and 3 missing", slots, missing)
	}
	for id, want := range map[int]int32{1: 2, 2: 1} {
		if ref, _ := p.RefCount(key(id)); ref != want {
			t.Fatalf("block %d: ref %d, want %d", id, ref, want)
		}
	}
	if ref, _ := p.RefCount(key(3)); ref >= 0 {
		t.Fatalf("pending block 3 pinned: ref %d", ref)
	}
	if err := p.CompleteLoad(ks(1, 2, 1)); err != nil {
		t.Fatal(err)
	}
	if got, missing := p.PrepareLoadPresent(ks(1, 2)); missing != 0 || got[0] < 0 || got[1] < 0 {
		t.Fatalf("all present: %v %d", got, missing)
	}
}

// A slot's generation moves each time it is given a block (a store or a
// bound lease), and only then: (slot, gen) names one block's bytes.
func TestSlotGen(t *testing.T) {
	p := newPrimary(t, 1, PolicyLRU)
	storeOK(t, p, 1)
	s, _ := p.SlotOf(key(1))
	g1 := p.SlotGen(s)
	if g1 == 0 {
		t.Fatal("a stored block's slot has generation 0")
	}
	if _, err := p.PrepareLoad(ks(1)); err != nil {
		t.Fatal(err)
	}
	if err := p.CompleteLoad(ks(1)); err != nil {
		t.Fatal(err)
	}
	if p.SlotGen(s) != g1 {
		t.Fatal("a load moved the generation")
	}
	storeOK(t, p, 2) // evicts 1 from the only slot
	if s2, _ := p.SlotOf(key(2)); s2 != s || p.SlotGen(s) == g1 {
		t.Fatalf("slot %d gen %d after another block, was %d", s2, p.SlotGen(s), g1)
	}
	g2 := p.SlotGen(s)
	slots, _ := p.Lease(1) // evicts 2
	if len(slots) != 1 || slots[0] != s {
		t.Fatalf("lease: %v", slots)
	}
	if ok, err := p.Bind(slots[0], key(3)); err != nil || !ok || p.SlotGen(s) == g2 {
		t.Fatalf("bind: %v %v, gen %d (was %d)", ok, err, p.SlotGen(s), g2)
	}
	if p.SlotGen(-1) != 0 || p.SlotGen(99) != 0 {
		t.Fatal("generation of a slot out of range")
	}
}

func arcOf(p *Primary) *arcPolicy { return p.pol.(*arcPolicy) }

func (a *arcPolicy) listIDs(l list) []int {
	var out []int
	for s := l.head; s >= 0; s = a.b.links[s].next {
		out = append(out, ids([]offload.Key{a.b.meta[s].key})[0])
	}
	return out
}

// ghostOf reports which ghost list holds k: 1 (B1), 2 (B2) or 0.
func (a *arcPolicy) ghostOf(k offload.Key) int {
	g := a.ghosts.find(ghostID(uint32(a.b.hash(k))))
	if g == noGhost {
		return 0
	}
	return a.ghosts.list(g) + 1
}

func (a *arcPolicy) where(k offload.Key) uint8 {
	s := a.b.lookup(k)
	if s < 0 {
		return inNoList
	}
	return a.b.meta[s].list
}

// Case 41: ARC basic — new blocks enter T1.
func TestARCBasic(t *testing.T) {
	p := newPrimary(t, 4, PolicyARC)
	store(t, p, []int{1, 2}, []int{1, 2}, []int{0, 1}, []int{})
	lookups(t, p, map[int]offload.LookupResult{1: offload.HitPending, 2: offload.HitPending})
	p.CompleteStore(ks(1, 2), true)
	lookups(t, p, map[int]offload.LookupResult{1: offload.Hit, 2: offload.Hit, 3: offload.Miss})
	a := arcOf(p)
	if a.t1.n != 2 || a.t2.n != 0 {
		t.Fatalf("|T1|=%d |T2|=%d, want 2, 0", a.t1.n, a.t2.n)
	}
}

// Case 42: a touch promotes a ready block from T1 to T2; a pending block
// stays in T1.
func TestARCPromoteToT2(t *testing.T) {
	p := newPrimary(t, 4, PolicyARC)
	storeOK(t, p, 1)
	a := arcOf(p)
	if a.where(key(1)) != inT1 {
		t.Fatal("1 not in T1")
	}
	p.Touch(ks(1))
	if a.where(key(1)) != inT2 {
		t.Fatal("touched 1 not in T2")
	}
	p.PrepareStore(ks(2))
	p.Touch(ks(2))
	if a.where(key(2)) != inT1 {
		t.Fatal("touched pending 2 left T1")
	}
}

// Case 43: pinned blocks are not evicted; once unpinned they are.
func TestARCEvictionWithLoad(t *testing.T) {
	p := newPrimary(t, 4, PolicyARC)
	storeOK(t, p, 1, 2, 3, 4)
	slots, err := p.PrepareLoad(ks(2, 3))
	if err != nil || !slices.Equal(slots, []int64{1, 2}) {
		t.Fatalf("PrepareLoad = %v, %v", slots, err)
	}
	store(t, p, []int{5, 6, 7}, nil, nil, nil)
	if err := p.CompleteLoad(ks(2, 3)); err != nil {
		t.Fatal(err)
	}
	out, ok := p.PrepareStore(ks(5, 6, 7))
	if !ok || len(out.Evicted) < 1 {
		t.Fatalf("PrepareStore after unpin = %v, %v", out, ok)
	}
}

// Case 44: touching a B1 ghost raises target_t1_size.
func TestARCAdaptiveTarget(t *testing.T) {
	p := newPrimary(t, 2, PolicyARC)
	storeOK(t, p, 1, 2)
	out := storeOK(t, p, 3)
	a := arcOf(p)
	if !slices.Equal(ids(out.Evicted), []int{1}) || a.ghostOf(key(1)) != 1 {
		t.Fatalf("evicted %v, ghost of 1 in B%d; want 1 in B1", ids(out.Evicted), a.ghostOf(key(1)))
	}
	before := a.target
	p.Touch(ks(1))
	if a.target <= before {
		t.Fatalf("target %v after B1 touch, was %v", a.target, before)
	}
}

// Case 45: with T1 above its target, the T1 LRU block is evicted.
func TestARCEvictFromT1(t *testing.T) {
	p := newPrimary(t, 4, PolicyARC)
	storeOK(t, p, 1, 2, 3, 4)
	p.Touch(ks(3, 4))
	a := arcOf(p)
	if got := [][]int{a.listIDs(a.t1), a.listIDs(a.t2)}; !cmp.Equal(got, [][]int{{1, 2}, {4, 3}}) {
		t.Fatalf("T1, T2 = %v", got)
	}
	a.target = 1
	out := storeOK(t, p, 5)
	if !slices.Equal(ids(out.Evicted), []int{1}) || a.ghostOf(key(1)) != 1 || a.where(key(5)) != inT1 {
		t.Fatalf("evicted %v, ghost %d, 5 in list %d", ids(out.Evicted), a.ghostOf(key(1)), a.where(key(5)))
	}
}

// Case 46: ghost lists stay within the cache capacity.
func TestARCGhostBounds(t *testing.T) {
	p := newPrimary(t, 2, PolicyARC)
	a := arcOf(p)
	for i := 1; i <= 19; i++ {
		storeOK(t, p, i)
		if i%3 == 0 {
			p.Touch(ks(i)) // feed T2 so that B2 fills too
		}
		if a.ghosts.lists[0].n > 2 || a.ghosts.lists[1].n > 2 {
			t.Fatalf("after %d: |B1|=%d |B2|=%d", i, a.ghosts.lists[0].n, a.ghosts.lists[1].n)
		}
	}
	if a.ghosts.lists[0].n != 2 {
		t.Errorf("|B1|=%d, want full (2)", a.ghosts.lists[0].n)
	}
}

// Case 47: touch order decides T2 order; the T1 remainder is evicted.
func TestARCTouchOrdering(t *testing.T) {
	p := newPrimary(t, 4, PolicyARC)
	storeOK(t, p, 1, 2, 3, 4)
	p.Touch(ks(3, 4))
	p.Touch(ks(1, 3, 4))
	a := arcOf(p)
	if got := [][]int{a.listIDs(a.t1), a.listIDs(a.t2)}; !cmp.Equal(got, [][]int{{2}, {4, 3, 1}}) {
		t.Fatalf("T1, T2 = %v", got)
	}
	store(t, p, []int{5}, []int{5}, []int{1}, []int{2})
}

// Case 48: a failed store leaves no block and no ghost; the evicted key
// stays in B1.
func TestARCFailedStore(t *testing.T) {
	p := newPrimary(t, 4, PolicyARC)
	storeOK(t, p, 1, 2, 3, 4)
	store(t, p, []int{5}, []int{5}, []int{0}, []int{1})
	p.CompleteStore(ks(5), false)
	a := arcOf(p)
	lookups(t, p, map[int]offload.LookupResult{5: offload.Miss})
	if a.where(key(5)) != inNoList || a.ghostOf(key(5)) != 0 || slices.Contains(a.listIDs(a.t1), 5) {
		t.Fatal("failed store left 5 in a list")
	}
	if a.ghostOf(key(1)) != 1 {
		t.Fatal("evicted 1 not in B1")
	}
}

// Case 49: the full ARC scenario.
func TestARCScenario(t *testing.T) {
	p := newPrimary(t, 4, PolicyARC)
	storeOK(t, p, 1, 2)
	out := storeOK(t, p, 3, 4, 5)
	if len(out.Evicted) != 1 {
		t.Fatalf("evicted %v, want one", ids(out.Evicted))
	}
	p.Touch(ks(2, 3))
	a := arcOf(p)
	if a.t1.n != 2 || a.t2.n != 2 {
		t.Fatalf("|T1|=%d |T2|=%d, want 2, 2", a.t1.n, a.t2.n)
	}
	storeOK(t, p, 6)
	lookups(t, p, map[int]offload.LookupResult{2: offload.Hit, 3: offload.Hit})
	if len(p.TakeEvents()) == 0 {
		t.Fatal("no events")
	}
	checkInvariants(t, p)
}

// spyPolicy counts evict calls.
type spyPolicy struct {
	policy
	evicts int
}

func (s *spyPolicy) evict(n int, epoch uint32, out []int32, revoke func(int32) bool) ([]int32, bool) {
	s.evicts++
	return s.policy.evict(n, epoch, out, revoke)
}

// Case 51: the evictable count follows ref counts, and a store that
// cannot possibly fit never consults the policy.
func TestEvictableCount(t *testing.T) {
	for _, pol := range policies {
		t.Run(pol, func(t *testing.T) {
			p := newPrimary(t, 4, pol)
			step := func(what string, want int) {
				t.Helper()
				if got := p.Stats().Evictable; got != want {
					t.Fatalf("after %s: evictable %d, want %d", what, got, want)
				}
				checkInvariants(t, p)
			}
			step("start", 0)
			p.PrepareStore(ks(1, 2, 3))
			step("store", 0)
			p.CompleteStore(ks(1, 2, 3), true)
			step("complete", 3)
			p.PrepareLoad(ks(1))
			step("load", 2)
			p.PrepareLoad(ks(1))
			step("load again", 2)
			p.CompleteLoad(ks(1))
			step("complete_load", 2)
			p.CompleteLoad(ks(1))
			step("complete_load again", 3)
			out, ok := p.PrepareStore(ks(4, 5, 6))
			if !ok || len(out.Evicted) != 2 {
				t.Fatalf("store [4 5 6] = %v %v, want 2 evictions", out, ok)
			}
			step("store with evictions", 1)
			p.CompleteStore(ks(4, 5, 6), false)
			step("failed store", 1)
			p.Reset()
			step("reset", 0)

			q := newPrimary(t, 3, pol)
			spy := &spyPolicy{policy: q.pol}
			q.pol = spy
			storeOK(t, q, 1, 2, 3)
			if _, err := q.PrepareLoad(ks(1, 2, 3)); err != nil {
				t.Fatal(err)
			}
			if _, ok := q.PrepareStore(ks(4)); ok || spy.evicts != 0 {
				t.Fatalf("PrepareStore with all pinned: ok %v, %d evict calls", ok, spy.evicts)
			}
		})
	}
}

// Case 52: usage gauges — pending and pinned slots over all slots.
func TestUsageGauges(t *testing.T) {
	p := newPrimary(t, 4, PolicyLRU)
	type usage struct{ Write, Read, Total float64 }
	check := func(what string, want usage) {
		t.Helper()
		st := p.Stats()
		if got := (usage{st.WriteUsage, st.ReadUsage, st.Usage}); got != want {
			t.Fatalf("after %s: usage %+v, want %+v", what, got, want)
		}
	}
	check("start", usage{})
	p.PrepareStore(ks(1, 2))
	check("2 pending", usage{0.5, 0, 0.5})
	p.PrepareStore(ks(3, 4))
	check("4 pending", usage{1, 0, 1})
	p.CompleteStore(ks(1, 2), true)
	check("2 completed", usage{0.5, 0, 0.5})
	p.CompleteStore(ks(3, 4), true)
	check("all completed", usage{})
	p.PrepareLoad(ks(1))
	check("load 1", usage{0, 0.25, 0.25})
	p.PrepareStore(ks(5, 6)) // evicts 2 and 3
	p.PrepareLoad(ks(1))     // a second reader of the same block
	check("store 2 + load 1", usage{0.5, 0.25, 0.75})
	p.CompleteStore(ks(5, 6), false)
	check("failed store", usage{0, 0.25, 0.25})
}

func TestPrepareStoreDuplicatesAndPresent(t *testing.T) {
	for _, n := range []int{4, 40} { // scan and map deduplication
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			p := newPrimary(t, 64, PolicyLRU)
			storeOK(t, p, 1)
			p.PrepareStore(ks(2)) // pending counts as present
			var keys, want []int
			for i := 0; i < n; i++ {
				keys = append(keys, 1, 2, 100+i, 100+i)
				want = append(want, 100+i)
			}
			out, ok := p.PrepareStore(ks(keys...))
			if !ok || !slices.Equal(ids(out.KeysToStore), want) {
				t.Fatalf("keys to store %v, want %v", ids(out.KeysToStore), want)
			}
			out, ok = p.PrepareStore(ks(1, 2))
			if !ok || out.KeysToStore != nil || out.Slots != nil || out.Evicted != nil {
				t.Fatalf("all present: %+v %v, want empty output and ok", out, ok)
			}
			checkInvariants(t, p)
		})
	}
}

func TestLoadErrors(t *testing.T) {
	p := newPrimary(t, 4, PolicyLRU)
	storeOK(t, p, 1)
	p.PrepareStore(ks(2))
	for _, tc := range []struct {
		keys []int
		err  error
	}{
		{[]int{1, 3}, ErrUnknownKey},
		{[]int{1, 2}, ErrNotReady},
	} {
		if _, err := p.PrepareLoad(ks(tc.keys...)); !errors.Is(err, tc.err) {
			t.Errorf("PrepareLoad(%v) = %v, want %v", tc.keys, err, tc.err)
		}
		if ref, _ := p.RefCount(key(1)); ref != 0 {
			t.Fatalf("failed PrepareLoad pinned 1 (ref %d)", ref)
		}
	}
	if err := p.CompleteLoad(ks(1)); !errors.Is(err, ErrNotPinned) {
		t.Errorf("CompleteLoad unpinned = %v", err)
	}
	if _, err := p.PrepareLoad(ks(1)); err != nil {
		t.Fatal(err)
	}
	// Listed twice but pinned once: error, and the one pin stays.
	if err := p.CompleteLoad(ks(1, 1)); !errors.Is(err, ErrNotPinned) {
		t.Errorf("CompleteLoad twice = %v", err)
	}
	if ref, _ := p.RefCount(key(1)); ref != 1 {
		t.Fatalf("ref %d after failed CompleteLoad, want 1", ref)
	}
	if err := p.CompleteLoad(ks(9)); !errors.Is(err, ErrUnknownKey) {
		t.Errorf("CompleteLoad absent = %v", err)
	}
	if err := p.CompleteLoad(ks(1)); err != nil {
		t.Fatal(err)
	}
	if ref, _ := p.RefCount(key(1)); ref != 0 || p.Stats().Evictable != 1 {
		t.Fatalf("ref %d evictable %d", ref, p.Stats().Evictable)
	}
}

func TestConfigErrors(t *testing.T) {
	for _, cfg := range []Config{
		{SlotSize: 0, Capacity: 100},
		{SlotSize: 64, Capacity: 63},
		{SlotSize: 64, Capacity: 640, Policy: "lfu"},
		{SlotSize: 64, Capacity: 640, Arena: ArenaConfig{Kind: "gpu"}},
		{SlotSize: 64, Capacity: 640, Arena: ArenaConfig{Kind: ArenaFile}},
		{SlotSize: 1 << 20, Capacity: 1 << 62},
	} {
		if p, err := New(cfg); err == nil {
			p.Close()
			t.Errorf("New(%+v) succeeded", cfg)
		}
	}
}

func TestArenaKinds(t *testing.T) {
	for _, ac := range []ArenaConfig{{}, {Kind: ArenaMemfd}, {Kind: ArenaFile, Path: filepath.Join(t.TempDir(), "a")}} {
		p, err := New(Config{SlotSize: 100, Capacity: 1050, Policy: "ARC", Arena: ac})
		if err != nil {
			t.Fatal(err)
		}
		if p.NumSlots() != 10 || p.Policy() != PolicyARC || p.Arena().NumSlots() != 10 {
			t.Fatalf("%+v: %d slots, policy %s", ac, p.NumSlots(), p.Policy())
		}
		out := storeOK(t, p, 7)
		b, err := p.Arena().Slot(out.Slots[0])
		if err != nil || len(b) != 100 {
			t.Fatalf("Slot: %v", err)
		}
		if _, err := p.Arena().Slot(10); !errors.Is(err, offload.ErrSlotOutOfRange) {
			t.Fatalf("Slot(10) = %v", err)
		}
		if a := p.SlotArena(); (ac.Kind == ArenaFile) != (a.Path() != "") {
			t.Fatalf("Path %q for %+v", a.Path(), ac)
		}
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestResetAndStats(t *testing.T) {
	p := newPrimary(t, 4, PolicyARC)
	storeOK(t, p, 1, 2, 3, 4)
	p.PrepareLoad(ks(1))
	p.PrepareStore(ks(5)) // evicts 2
	p.Lookup(key(1))
	p.Lookup(key(9))
	p.TakeEvents()
	p.Reset()
	if evs := p.TakeEvents(); len(evs) != 0 {
		t.Fatalf("reset emitted %v", evs)
	}
	// Block 1 is pinned and 5 is being written: they stay, with their
	// slots; 3 and 4 go.
	st := p.Stats()
	if st.Blocks != 2 || st.Pending != 1 || st.Pinned != 1 || st.Evictable != 0 || st.FreeSlots != 2 {
		t.Fatalf("after reset: %+v", st)
	}
	if st.Lookups != 2 || st.Hits != 1 || st.Misses != 1 || st.Evictions != 1 || st.StoredBlocks != 4 || st.Loads != 1 {
		t.Fatalf("counters: %+v", st)
	}
	lookups(t, p, map[int]offload.LookupResult{1: offload.Hit, 3: offload.Miss, 4: offload.Miss, 5: offload.HitPending})
	slot1, _ := p.SlotOf(key(1))
	slot5, _ := p.SlotOf(key(5))
	// New stores get the freed slots, never the held ones.
	out, ok := p.PrepareStore(ks(6, 7))
	if !ok || slices.Contains(out.Slots, slot1) || slices.Contains(out.Slots, slot5) {
		t.Fatalf("stores after the reset took %v (held: %d, %d)", out.Slots, slot1, slot5)
	}
	p.CompleteStore(ks(6, 7), true)
	if err := p.CompleteLoad(ks(1)); err != nil {
		t.Fatal(err)
	}
	p.CompleteStore(ks(5), true)
	lookups(t, p, map[int]offload.LookupResult{1: offload.Hit, 5: offload.Hit, 6: offload.Hit})
	checkInvariants(t, p)
}

func TestEventsDisabled(t *testing.T) {
	p, err := New(Config{SlotSize: 8, Capacity: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	storeOK(t, p, 1, 2)
	storeOK(t, p, 3)
	if evs := p.TakeEvents(); evs != nil {
		t.Fatalf("events disabled but got %v", evs)
	}
}

// fatalf is what checkInvariants needs of a *testing.T or a *rapid.T.
type fatalf interface {
	Helper()
	Fatalf(format string, args ...any)
}

// checkInvariants verifies the bookkeeping against the metadata arrays.
func checkInvariants(t fatalf, p *Primary) {
	t.Helper()
	owner := map[int32]offload.Key{}
	var pending, evictable, blocks int
	for s := int32(0); s < p.numSlots; s++ {
		m := p.b.meta[s]
		if m.key == "" {
			if m.ref != 0 || m.list != inNoList {
				t.Fatalf("free slot %d has state %+v", s, m)
			}
			continue
		}
		if s >= p.numAllocated {
			t.Fatalf("slot %d owned beyond the allocation mark %d", s, p.numAllocated)
		}
		if m.ref < -1 {
			t.Fatalf("slot %d ref %d < -1", s, m.ref)
		}
		if got := p.b.lookup(m.key); got != s {
			t.Fatalf("index maps %s to %d, owner slot %d", m.key, got, s)
		}
		owner[s] = m.key
		blocks++
		switch {
		case m.ref == -1:
			pending++
		case m.ref == 0:
			evictable++
		}
	}
	free := freeSlots(p)
	for _, s := range free {
		if _, ok := owner[s]; ok {
			t.Fatalf("slot %d both free and owned by %s", s, owner[s])
		}
	}
	if blocks+len(free) != int(p.numAllocated) || len(free) != p.numFree {
		t.Fatalf("%d owned + %d free (count %d) != %d allocated", blocks, len(free), p.numFree, p.numAllocated)
	}
	if pending != p.numPending || evictable != p.numEvictable || blocks != p.numBlocks {
		t.Fatalf("counts pending %d/%d evictable %d/%d blocks %d/%d", pending, p.numPending, evictable, p.numEvictable, blocks, p.numBlocks)
	}
	switch pol := p.pol.(type) {
	case *lruPolicy:
		n := 0
		for s := pol.evictable.head; s >= 0; s = p.b.links[s].next {
			if p.b.meta[s].ref != 0 {
				t.Fatalf("LRU list holds slot %d with ref %d", s, p.b.meta[s].ref)
			}
			n++
		}
		if n != evictable || pol.evictable.n != n {
			t.Fatalf("LRU list length %d (n=%d), evictable %d", n, pol.evictable.n, evictable)
		}
	case *arcPolicy:
		n := 0
		for _, l := range []list{pol.t1, pol.t2} {
			for s := l.head; s >= 0; s = p.b.links[s].next {
				n++
			}
		}
		if n != blocks || pol.t1.n+pol.t2.n != blocks {
			t.Fatalf("ARC lists hold %d, blocks %d", n, blocks)
		}
		checkGhosts(t, &pol.ghosts, pol.capacity)
		if pol.target < 0 || pol.target > float64(pol.capacity) {
			t.Fatalf("target %v", pol.target)
		}
	}
}

// When T1 is below its target and T2 has no candidate, ARC evicts from T1
// rather than refusing the store: docs/semantics.md §3.4 fails only when neither list
// has a candidate.
func TestARCFallbackToT1(t *testing.T) {
	p := newPrimary(t, 2, PolicyARC)
	storeOK(t, p, 1, 2)
	storeOK(t, p, 3) // evicts 1 into B1
	p.Touch(ks(3))   // T1 [2], T2 [3]
	p.Touch(ks(1))
	p.Touch(ks(1)) // two B1 hits: target 2 > |T1|
	a := arcOf(p)
	if a.target != 2 {
		t.Fatalf("target %v, want 2", a.target)
	}
	if _, err := p.PrepareLoad(ks(3)); err != nil { // T2's only block pinned
		t.Fatal(err)
	}
	store(t, p, []int{4}, []int{4}, []int{1}, []int{2})
}

// Case 50: the reuse filter stores a key only after StoreThreshold lookups
// counted by an LRU-bounded tracker.
func TestReuseFilter(t *testing.T) {
	p, err := New(Config{SlotSize: 8, Capacity: 8 * 4, StoreThreshold: 2, ReuseTrackerSize: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	lookups(t, p, map[int]offload.LookupResult{1: offload.Miss})
	lookups(t, p, map[int]offload.LookupResult{2: offload.Miss})
	out, ok := p.PrepareStore(ks(1, 2))
	if !ok || len(out.KeysToStore) != 0 {
		t.Fatalf("first store: %+v %v, want empty and ok", out, ok)
	}
	lookups(t, p, map[int]offload.LookupResult{1: offload.Miss})
	out, ok = p.PrepareStore(ks(1, 2))
	if !ok || !slices.Equal(ids(out.KeysToStore), []int{1}) {
		t.Fatalf("second store: %v %v, want [1]", ids(out.KeysToStore), ok)
	}
	p.Lookup(key(3))
	p.Lookup(key(4)) // pushes 2 (least recent) out of the tracker
	p.Lookup(key(2)) // back with count 1
	out, ok = p.PrepareStore(ks(2))
	if !ok || len(out.KeysToStore) != 0 {
		t.Fatalf("store of 2 after it left the tracker: %v %v", ids(out.KeysToStore), ok)
	}
	if got := p.Stats().SkippedStores; got != 4 { // 1 and 2, then 2, then 2
		t.Fatalf("skipped %d, want 4", got)
	}
	for _, cfg := range []Config{
		{SlotSize: 8, Capacity: 8, StoreThreshold: -1},
		{SlotSize: 8, Capacity: 8, StoreThreshold: 2, ReuseTrackerSize: -1},
	} {
		if _, err := New(cfg); err == nil {
			t.Errorf("New(%+v) succeeded", cfg)
		}
	}
}

// The hit path must not allocate (docs/design.md §8); this guards it in every
// test run, where benchmarks do not run.
func TestHitPathDoesNotAllocate(t *testing.T) {
	for _, pol := range policies {
		t.Run(pol, func(t *testing.T) {
			p := newPrimary(t, 64, pol)
			keys, absent := ks(1, 2, 3, 4, 5, 6, 7, 8), key(99)
			storeOK(t, p, 1, 2, 3, 4, 5, 6, 7, 8)
			p.PrepareLoad(keys) // warm the scratch buffers
			p.CompleteLoad(keys)
			for name, f := range map[string]func(){
				"Lookup": func() { p.Lookup(keys[3]); p.Lookup(absent) },
				"Touch":  func() { p.Touch(keys) },
				"SlotOf": func() { p.SlotOf(keys[0]) },
			} {
				if n := testing.AllocsPerRun(100, f); n != 0 {
					t.Errorf("%s: %v allocs/op", name, n)
				}
			}
			// PrepareLoad allocates only the slots it returns.
			n := testing.AllocsPerRun(100, func() {
				p.PrepareLoad(keys)
				p.CompleteLoad(keys)
			})
			if n != 1 {
				t.Errorf("PrepareLoad+CompleteLoad: %v allocs/op, want 1", n)
			}
			checkInvariants(t, p)
		})
	}
}

// freeSlots returns the free slots as a stack, bottom first (the next
// slot reused is last).
func freeSlots(p *Primary) []int32 {
	var out []int32
	for s := p.freeHead; s >= 0; s = p.b.links[s].next {
		out = append(out, s)
	}
	slices.Reverse(out)
	return out
}

// checkGhosts checks the ghost table: each list is within capacity and
// doubly linked consistently, every ghost on a list is found by its
// identity, and no entry is off the lists.
func checkGhosts(t fatalf, g *ghostTable, capacity int) {
	t.Helper()
	total := 0
	for l, gl := range g.lists {
		if gl.n > capacity {
			t.Fatalf("ghost list %d holds %d, capacity %d", l, gl.n, capacity)
		}
		n, prev := 0, noGhost
		for i := gl.head; i != noGhost; i = g.e[i].next {
			e := g.e[i]
			if e.id == 0 || g.list(i) != l || e.prev != prev {
				t.Fatalf("ghost list %d: entry %d = %+v, previous %d", l, i, e, prev)
			}
			if f := g.find(e.id &^ 1); f != i {
				t.Fatalf("ghost %d (id %#x) found at %d", i, e.id, f)
			}
			prev = i
			n++
		}
		if n != gl.n || prev != gl.tail {
			t.Fatalf("ghost list %d: walked %d to %d, has n %d tail %d", l, n, prev, gl.n, gl.tail)
		}
		total += n
	}
	used := 0
	for _, e := range g.e {
		if e.id != 0 {
			used++
		}
	}
	if used != total {
		t.Fatalf("ghost table holds %d entries, lists %d", used, total)
	}
}
