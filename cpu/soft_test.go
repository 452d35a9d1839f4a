package cpu

import (
	"errors"
	"testing"

	"github.com/kvtier/kvtier/offload"
)

// Soft pins (cascades) keep a block's place in the eviction order: with a
// revoker that releases them the primary evicts exactly what it would
// have evicted with no pin at all; without one, or when the revoker
// refuses, the block is skipped like a pinned one.
func TestSoftPinsKeepEvictionOrder(t *testing.T) {
	for _, policy := range []string{PolicyLRU, PolicyARC} {
		t.Run(policy, func(t *testing.T) {
			p := newPrimary(t, 3, policy)
			storeOK(t, p, 1)
			storeOK(t, p, 2)
			storeOK(t, p, 3)
			slots, err := p.PinSoft(ks(1))
			if err != nil {
				t.Fatal(err)
			}
			if st := p.Stats(); st.Evictable != 2 || st.Revocable != 1 || st.Pinned != 1 {
				t.Fatalf("after a soft pin: %+v", st)
			}
			// No revoker: the softly pinned oldest block is skipped.
			store(t, p, []int{4}, []int{4}, []int{1}, []int{2})
			p.CompleteStore(ks(4), true)

			// A revoker that refuses: skipped again.
			var asked []int64
			p.SetRevoker(func(s int64) bool { asked = append(asked, s); return false })
			store(t, p, []int{5}, []int{5}, []int{2}, []int{3})
			p.CompleteStore(ks(5), true)
			if len(asked) != 1 || asked[0] != slots[0] {
				t.Fatalf("revoker asked about %v, want [%d]", asked, slots[0])
			}

			// A revoker that releases: block 1 goes first, as the oldest.
			p.SetRevoker(func(s int64) bool { return p.UnpinSoft([]int64{s}) == nil })
			store(t, p, []int{6}, []int{6}, []int{int(slots[0])}, []int{1})
			p.CompleteStore(ks(6), true)
			if st := p.Stats(); st.Revocable != 0 || st.Pinned != 0 || st.Revocations != 2 {
				t.Fatalf("after the revocation: %+v", st)
			}
		})
	}
}

// Hard pins on a softly pinned block take it out of the order; when they
// go the block is listed again as most recent (a load is a use), still
// held by its soft pins.
func TestHardPinsOverSoftPins(t *testing.T) {
	p := newPrimary(t, 3, PolicyLRU)
	storeOK(t, p, 1)
	storeOK(t, p, 2)
	storeOK(t, p, 3)
	soft, err := p.PinSoft(ks(1))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.PrepareLoad(ks(1)); err != nil {
		t.Fatal(err)
	}
	if st := p.Stats(); st.Revocable != 0 || st.Evictable != 2 {
		t.Fatalf("hard over soft: %+v", st)
	}
	p.SetRevoker(func(s int64) bool {
		t.Errorf("revoker asked about slot %d, which has a hard pin", s)
		return false
	})
	store(t, p, []int{4}, []int{4}, []int{1}, []int{2})
	p.CompleteStore(ks(4), true)
	if err := p.CompleteLoad(ks(1)); err != nil {
		t.Fatal(err)
	}
	if err := p.CompleteLoad(ks(1)); !errors.Is(err, ErrNotPinned) {
		t.Fatalf("a second CompleteLoad (only soft pins left): %v, want ErrNotPinned", err)
	}
	if st := p.Stats(); st.Revocable != 1 || st.Evictable != 2 {
		t.Fatalf("soft only again: %+v", st)
	}
	// Block 1 is now the most recent: 3 goes first.
	p.SetRevoker(func(s int64) bool { return p.UnpinSoft([]int64{s}) == nil })
	store(t, p, []int{5}, []int{5}, []int{2}, []int{3})
	p.CompleteStore(ks(5), true)
	if err := p.UnpinSoft(soft); err != nil {
		t.Fatal(err)
	}
	if err := p.UnpinSoft(soft); !errors.Is(err, ErrNotPinned) {
		t.Fatalf("unpinning a soft pin twice: %v", err)
	}
	if err := p.UnpinSlots(soft); !errors.Is(err, ErrNotPinned) {
		t.Fatalf("UnpinSlots of a soft pin: %v, want ErrNotPinned", err)
	}
	if st := p.Stats(); st.Pinned != 0 || st.Evictable != 3 {
		t.Fatalf("at the end: %+v", st)
	}
}

// A store that cannot fit fails without evicting: it asks no revoker when
// even every soft pin released would not make room, and when a revoker
// refuses half-way the soft pins released so far stay released.
func TestSoftPinsStoreThatCannotFit(t *testing.T) {
	p := newPrimary(t, 3, PolicyLRU)
	storeOK(t, p, 1)
	storeOK(t, p, 2)
	storeOK(t, p, 3)
	soft, err := p.PinSoft(ks(1, 2))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.PrepareLoad(ks(3)); err != nil {
		t.Fatal(err)
	}
	p.SetRevoker(func(s int64) bool {
		return s == soft[0] && p.UnpinSoft([]int64{s}) == nil
	})
	store(t, p, []int{4, 5, 6}, nil, nil, nil)
	if st := p.Stats(); st.Revocations != 0 || st.Revocable != 2 {
		t.Fatalf("a store that cannot fit asked the revoker: %+v", st)
	}
	store(t, p, []int{4, 5}, nil, nil, nil)
	lookups(t, p, map[int]offload.LookupResult{1: offload.Hit, 2: offload.Hit, 3: offload.Hit})
	if st := p.Stats(); st.Evictable != 1 || st.Revocable != 1 || st.Blocks != 3 || st.Revocations != 2 {
		t.Fatalf("after the failed store: %+v", st)
	}
}

// A lease never revokes a cascade: it reserves room for stores that may
// not come, so it evicts only settled blocks and leases fewer slots when
// the rest are softly pinned.
func TestLeaseLeavesSoftPinnedBlocks(t *testing.T) {
	for _, policy := range []string{PolicyLRU, PolicyARC} {
		t.Run(policy, func(t *testing.T) {
			p := newPrimary(t, 3, policy)
			storeOK(t, p, 1)
			storeOK(t, p, 2)
			storeOK(t, p, 3)
			if _, err := p.PinSoft(ks(1, 2)); err != nil {
				t.Fatal(err)
			}
			asked := 0
			p.SetRevoker(func(s int64) bool { asked++; return p.UnpinSoft([]int64{s}) == nil })
			slots, evicted := p.Lease(3)
			if len(slots) != 1 || len(evicted) != 1 || evicted[0] != ks(3)[0] || asked != 0 {
				t.Fatalf("lease: slots %v, evicted %v, revoker asked %d times", slots, evicted, asked)
			}
			if st := p.Stats(); st.Revocable != 2 || st.Revocations != 0 {
				t.Fatalf("after the lease: %+v", st)
			}
		})
	}
}
