package tiering

import (
	"testing"

	"github.com/kvtier/kvtier/offload"
)

// A cascade the budget cannot take waits unpinned and goes once the
// budget frees: every stored block reaches the tier, none is dropped.
func TestBudgetDefersCascades(t *testing.T) {
	slow := newFake("slow", offload.MediumStorage, offload.LocalityRemote, nil)
	slow.hold = true
	// 16 slots: budget 4.
	m := budgetManager(t, 16, BudgetConfig{}, slow)
	req := reqWith("r", nil, nil)
	m.OnNewRequest(req)
	storeKeys(t, m, req, keyRange(0, 4)) // the budget, in flight
	storeKeys(t, m, req, keyRange(4, 7)) // over it: deferred
	storeKeys(t, m, req, keyRange(7, 9)) // behind it
	st := m.Stats()
	if ts := st.Tiers[0]; len(slow.stores) != 1 || ts.CascadesDropped != 0 || ts.CascadesDeferred != 2 {
		t.Fatalf("%d jobs, %d dropped, %d deferred; want 1 job and 2 deferred", len(slow.stores), ts.CascadesDropped, ts.CascadesDeferred)
	}
	if st.DeferredCascades != 2 || st.DeferredBlocks != 5 {
		t.Fatalf("deferred %d cascades, %d blocks; want 2, 5", st.DeferredCascades, st.DeferredBlocks)
	}
	// Deferred blocks hold no pin: only the cascade in flight does.
	if st.CascadePinned != 4 || st.Primary.Pinned != 4 {
		t.Fatalf("pinned %d (primary %d), want 4: deferred blocks must not pin", st.CascadePinned, st.Primary.Pinned)
	}
	slow.release()
	endStep(m) // the first cascade ends: the oldest deferred goes
	if len(slow.stores) != 2 || len(slow.stores[1].Keys) != 3 {
		t.Fatalf("after the budget freed: %d jobs, want the 3-block deferred one second", len(slow.stores))
	}
	slow.release()
	endStep(m)
	slow.release()
	endStep(m)
	st = m.Stats()
	var got []offload.Key
	for _, j := range slow.stores {
		got = append(got, j.Keys...)
	}
	if len(got) != 9 || st.DeferredBlocks != 0 || st.Tiers[0].CascadedBlocks != 9 || st.Tiers[0].CascadesDropped != 0 {
		t.Fatalf("tier got %d blocks (%d cascaded, %d dropped), %d still deferred; want all 9", len(got), st.Tiers[0].CascadedBlocks, st.Tiers[0].CascadesDropped, st.DeferredBlocks)
	}
	for i, k := range keyRange(0, 9) {
		if got[i] != k {
			t.Fatalf("block %d reached the tier as %v, want %v (in store order)", i, got[i], k)
		}
	}
	if st.CascadePinned != 0 || st.Primary.Pinned != 0 {
		t.Fatalf("pins left: %d (primary %d)", st.CascadePinned, st.Primary.Pinned)
	}
}

// A deferred block evicted before its turn is dropped as evicted (the
// primary alone would have lost it too); the rest of its cascade goes.
// Engine stores evict deferred blocks like any others.
func TestDeferredBlockEvicted(t *testing.T) {
	slow := newFake("slow", offload.MediumStorage, offload.LocalityRemote, nil)
	slow.hold = true
	// 8 slots: budget 2.
	m := budgetManager(t, 8, BudgetConfig{}, slow)
	req := reqWith("r", nil, nil)
	m.OnNewRequest(req)
	storeKeys(t, m, req, keyRange(0, 2)) // in flight, pinned
	storeKeys(t, m, req, keyRange(2, 4)) // deferred
	// Six new blocks in 8 slots, two of them pinned: two of the deferred
	// blocks must go.
	if !storeKeys(t, m, req, keyRange(10, 16)) {
		t.Fatal("an engine store was refused because of deferred cascades")
	}
	slow.release()
	endStep(m)
	for range 4 {
		slow.release()
		endStep(m)
	}
	st := m.Stats().Tiers[0]
	if st.DroppedBy[DropEvicted] == 0 || st.CascadeBlocksDropped == 0 {
		t.Fatalf("dropped %v (%d blocks): want the evicted deferred blocks counted as evicted", st.DroppedBy, st.CascadeBlocksDropped)
	}
	for _, j := range slow.stores {
		for _, k := range j.Keys {
			if k == K(2) || k == K(3) {
				t.Fatalf("evicted deferred block %v reached the tier", k)
			}
		}
	}
	if ms := m.Stats(); ms.DeferredBlocks != 0 || ms.Primary.Pinned != 0 {
		t.Fatalf("deferred %d blocks, pinned %d after all ended", ms.DeferredBlocks, ms.Primary.Pinned)
	}
}

// The queue is bounded: past MaxDeferred blocks a cascade over the budget
// is dropped with the budget's reason.
func TestDeferredQueueBound(t *testing.T) {
	slow := newFake("slow", offload.MediumStorage, offload.LocalityRemote, nil)
	slow.hold = true
	m := budgetManager(t, 32, BudgetConfig{MaxDeferred: 3}, slow) // budget 8
	req := reqWith("r", nil, nil)
	m.OnNewRequest(req)
	storeKeys(t, m, req, keyRange(0, 8))  // in flight
	storeKeys(t, m, req, keyRange(8, 10)) // deferred (2 of 3)
	storeKeys(t, m, req, keyRange(10, 12))
	st := m.Stats()
	if ts := st.Tiers[0]; ts.CascadesDeferred != 1 || ts.DroppedBy[DropBudget] != 1 || st.DeferredBlocks != 2 {
		t.Fatalf("deferred %d (%d blocks), dropped %v; want 1 deferred and 1 budget drop", ts.CascadesDeferred, st.DeferredBlocks, ts.DroppedBy)
	}
}

// A request that finishes while its cascade waits: the tiers hear of its
// finish first, and the cascade goes later under another id with the
// same store filter.
func TestDeferredCascadeAfterFinish(t *testing.T) {
	slow := newFake("slow", offload.MediumStorage, offload.LocalityRemote, nil)
	slow.hold = true
	m := budgetManager(t, 16, BudgetConfig{}, slow)
	req := reqWith("r", nil, nil)
	m.OnNewRequest(req)
	storeKeys(t, m, req, keyRange(0, 4))
	storeKeys(t, m, req, keyRange(4, 6))
	m.OnRequestFinished(req)
	slow.release()
	endStep(m)
	if len(slow.stores) != 2 {
		t.Fatalf("%d jobs, want the deferred one after the finish", len(slow.stores))
	}
	j := slow.stores[1]
	if j.Req.ID == req.ID || j.Req.StoreFilter != req.StoreFilter {
		t.Fatalf("deferred cascade under id %q, filter %v; want another id, the request's filter", j.Req.ID, j.Req.StoreFilter)
	}
}

// A queue that never empties (steady pressure: one in, one out) keeps an
// array the size of its live entries, not of everything that went through.
func TestDeferQueueStaysBounded(t *testing.T) {
	var d deferQueue
	req := reqWith("r", nil, nil)
	for i := range 10 {
		d.push(deferred{keys: keyRange(i, i+1), req: req})
	}
	for i := 10; i < 100_000; i++ {
		d.push(deferred{keys: keyRange(i, i+1), req: req})
		d.pop()
	}
	if d.len() != 10 || d.keys != 10 || cap(d.q) > 256 {
		t.Fatalf("%d queued (%d keys), array of %d entries: want 10 in a bounded array", d.len(), d.keys, cap(d.q))
	}
	if e := d.pop(); e.keys[0] != keyRange(99_990, 99_991)[0] {
		t.Fatalf("order lost: popped %v", e.keys[0])
	}
}
