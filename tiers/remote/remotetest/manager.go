package remotetest

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/kvtier/kvtier/cpu"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/tiering"
)

// ManagerCase describes how to drive one secondary tier through a
// tiering.Manager.
type ManagerCase struct {
	// Tier is the tier under test; the manager closes it.
	Tier offload.SecondaryTier
	// ExcludeLoad is a kv_transfer_params document whose kv_load_tiers
	// excludes Tier.
	ExcludeLoad string
	// SlotSize of the primary (default 64 KiB).
	SlotSize int
	// Dynamic: the tier declares no medium or locality and applies each
	// request's filter itself (a peer tier, whose peers each have their
	// own): a load it is excluded from is asked and answers MISS rather
	// than being skipped.
	Dynamic bool
}

// RunManager stores blocks through the manager (cascade to the tier),
// empties the primary, and loads them back through lookup → promotion →
// PrepareLoad, comparing bytes; then checks that a load filter excluding
// the tier keeps the manager from asking it, and that kv_store_tiers: []
// keeps blocks off it.
func RunManager(t *testing.T, c ManagerCase) {
	t.Helper()
	ctx, p, m := c.manager(t, 16)

	keys := Keys(4000, 4)
	want := make([][]byte, len(keys))

	// Store: GPU → primary, then the manager cascades to the tier.
	store := func(id string, params string, ks []offload.Key) {
		t.Helper()
		storeVia(t, m, p, id, params, ks, want)
	}
	store("writer", "", keys)
	st := m.Stats().Tiers[0]
	if st.CascadesOK != 1 || st.CascadedBlocks != uint64(len(keys)) || st.CascadesFailed != 0 {
		t.Fatalf("cascade stats %+v", st)
	}
	if err := m.Reset(ctx); err != nil { // empties the primary; the tier keeps its blocks
		t.Fatal(err)
	}

	// Load: lookups start existence checks and then a promotion.
	req, _ := offload.NewReqContext("reader", nil)
	m.OnNewRequest(req)
	deadline := time.Now().Add(30 * time.Second)
	out := make([]offload.LookupResult, len(keys))
	allHit := func() bool {
		if m.LookupPrefix(keys, req, out) < len(keys) {
			return false
		}
		for _, r := range out {
			if r != offload.Hit { // HitPending counts but is not readable yet
				return false
			}
		}
		return true
	}
	for !allHit() {
		for _, r := range out {
			if r == offload.Miss {
				t.Fatalf("lookup answered MISS for a stored block: %v", out)
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("blocks not promoted: %v", out)
		}
		m.ScheduleEnd(offload.ScheduleEnd{})
		time.Sleep(time.Millisecond)
	}
	slots, err := m.PrepareLoad(keys, req)
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range slots {
		b, _ := p.Arena().Slot(s)
		if !bytes.Equal(b, want[i]) {
			t.Fatalf("block %d differs after the round trip through the tier", i)
		}
	}
	if err := m.CompleteLoad(keys, req); err != nil {
		t.Fatal(err)
	}
	m.OnRequestFinished(req)
	st = m.Stats().Tiers[0]
	if st.PromotionsOK == 0 || st.PromotedBlocks != uint64(len(keys)) || st.Hits == 0 {
		t.Fatalf("promotion stats %+v", st)
	}

	// A load filter excluding the tier: it is not asked, the block misses.
	if err := m.Reset(ctx); err != nil {
		t.Fatal(err)
	}
	ex, err := offload.NewReqContext("excluded", c.ExcludeLoad)
	if err != nil {
		t.Fatal(err)
	}
	m.OnNewRequest(ex)
	before := m.Stats().Tiers[0]
	for i := 0; i < 3; i++ {
		if r := m.Lookup(keys[0], ex); r != offload.Miss {
			t.Fatalf("lookup with the tier filtered out: %v", r)
		}
		m.ScheduleEnd(offload.ScheduleEnd{})
	}
	after := m.Stats().Tiers[0]
	if !c.Dynamic && (after.SkippedByFilter <= before.SkippedByFilter || after.Hits+after.Misses+after.Retries != before.Hits+before.Misses+before.Retries) {
		t.Fatalf("filtered tier was asked: before %+v after %+v", before, after)
	}
	if c.Dynamic && after.Hits != before.Hits {
		t.Fatalf("a tier excluded by the load filter answered a hit: before %+v after %+v", before, after)
	}
	m.OnRequestFinished(ex)

	// kv_store_tiers: [] keeps new blocks off the tier.
	fresh := Keys(5000, 1)
	store("no-store", `{"kv_store_tiers": []}`, fresh)
	if st := m.Stats().Tiers[0]; st.CascadesSkippedByFilter == 0 || st.CascadesOK != 1 {
		t.Fatalf("store filter stats %+v", st)
	}
	if err := m.Reset(ctx); err != nil {
		t.Fatal(err)
	}
	chk, _ := offload.NewReqContext("check", nil)
	m.OnNewRequest(chk)
	r := offload.Retry
	for r == offload.Retry && time.Now().Before(deadline) {
		r = m.Lookup(fresh[0], chk)
		m.ScheduleEnd(offload.ScheduleEnd{})
		time.Sleep(time.Millisecond)
	}
	if r != offload.Miss {
		t.Fatalf("block stored with kv_store_tiers [] found in the tier: %v", r)
	}
	m.OnRequestFinished(chk)
}

// manager builds a manager over a primary of slots slots with the tier
// as its only secondary tier; it closes the manager (and so the tier)
// when the test ends. ctx bounds the test's manager calls.
func (c ManagerCase) manager(t testing.TB, slots int) (ctx context.Context, p *cpu.Primary, m *tiering.Manager) {
	t.Helper()
	slot := c.SlotSize
	if slot == 0 {
		slot = 64 << 10
	}
	p, err := cpu.New(cpu.Config{SlotSize: slot, Capacity: int64(slots * slot)})
	if err != nil {
		t.Fatal(err)
	}
	m, err = tiering.New(tiering.Config{Primary: p, Tiers: []offload.SecondaryTier{c.Tier}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(func() {
		m.Close(ctx)
		cancel()
	})
	return ctx, p, m
}

// storeVia stores ks for request id (with its params) through m: the
// primary's slots filled with bytes that depend on the slot and the id,
// recorded in want (co-indexed with ks), then the cascade settled.
func storeVia(t *testing.T, m *tiering.Manager, p *cpu.Primary, id, params string, ks []offload.Key, want [][]byte) {
	t.Helper()
	req, err := offload.NewReqContext(id, params)
	if err != nil {
		t.Fatal(err)
	}
	m.OnNewRequest(req)
	out, ok, err := m.PrepareStore(ks, req)
	if err != nil || !ok {
		t.Fatalf("PrepareStore: %v %v", ok, err)
	}
	for i, s := range out.Slots {
		b, _ := p.Arena().Slot(s)
		for j := range b {
			b[j] = byte(i*31 + j*7 + len(id))
		}
		for n, k := range ks {
			if k == out.KeysToStore[i] {
				want[n] = bytes.Clone(b)
			}
		}
	}
	if err := m.CompleteStore(out.KeysToStore, req, true); err != nil {
		t.Fatal(err)
	}
	m.OnRequestFinished(req)
	settle(t, m)
}

// RunManagerDelete stores blocks through the manager, deletes them
// (tiering.Manager.Delete: a router's or an agent's delete), and checks
// that the tier took part and removed them: with the primary empty, every
// lookup of them ends in MISS, never a promotion.
func RunManagerDelete(t *testing.T, c ManagerCase) {
	t.Helper()
	ctx, p, m := c.manager(t, 16)
	keys := Keys(5000, 4)
	storeVia(t, m, p, "writer", "", keys, make([][]byte, len(keys)))
	a, err := m.Delete(ctx, keys)
	if err != nil {
		t.Fatal(err)
	}
	if len(a.Tiers) != 1 || !a.Tiers[0].Supported || a.Tiers[0].Removed != len(keys) || a.Tiers[0].Err != nil {
		t.Fatalf("delete answer %+v, want the tier to remove %d blocks", a, len(keys))
	}
	req, _ := offload.NewReqContext("reader", nil)
	m.OnNewRequest(req)
	deadline := time.Now().Add(30 * time.Second)
	for {
		missed := 0
		for _, k := range keys {
			switch r := m.Lookup(k, req); r {
			case offload.Miss:
				missed++
			case offload.Retry:
			default:
				t.Fatalf("a deleted block looked up: %v", r)
			}
		}
		if missed == len(keys) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("deleted blocks still unsure after 30s (%d of %d missed)", missed, len(keys))
		}
		m.ScheduleEnd(offload.ScheduleEnd{})
		time.Sleep(time.Millisecond)
	}
	if st := m.Stats().Tiers[0]; st.PromotionsOK != 0 || st.PromotedBlocks != 0 {
		t.Fatalf("a deleted block was promoted: %+v", st)
	}
	m.OnRequestFinished(req)
}

// settle ends steps until the manager has no work in flight.
func settle(t *testing.T, m *tiering.Manager) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		m.ScheduleEnd(offload.ScheduleEnd{})
		if !m.HasPendingWork() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("manager still has pending work after 30s")
		}
		time.Sleep(time.Millisecond)
	}
}

// Outage hooks stop and restart the tier's server.
type Outage struct {
	Stop, Start func()
	// Healthy reports the tier's own health state.
	Healthy func() bool
}

// RunManagerOutage stops the tier's server in the middle of a run: the
// manager keeps serving from the primary, cascades to the tier fail fast
// and are counted, lookups of blocks only the tier had answer Miss
// quickly; after the restart the tier recovers by itself and cascades
// succeed again.
func RunManagerOutage(t *testing.T, c ManagerCase, o Outage) {
	t.Helper()
	ctx, _, m := c.manager(t, 64)

	next := 7000
	store := func() []offload.Key {
		t.Helper()
		ks := Keys(next, 2)
		next += 2
		req, _ := offload.NewReqContext("w"+ks[0].HexHash(), nil)
		m.OnNewRequest(req)
		out, ok, err := m.PrepareStore(ks, req)
		if err != nil || !ok {
			t.Fatalf("PrepareStore: %v %v", ok, err)
		}
		if err := m.CompleteStore(out.KeysToStore, req, true); err != nil {
			t.Fatal(err)
		}
		m.OnRequestFinished(req)
		settle(t, m)
		return ks
	}
	before := store()
	if st := m.Stats().Tiers[0]; st.CascadesOK != 1 {
		t.Fatalf("cascade before the outage %+v", st)
	}

	o.Stop()
	deadline := time.Now().Add(30 * time.Second)
	for o.Healthy() {
		if time.Now().After(deadline) {
			t.Fatal("tier still healthy 30s after its server stopped")
		}
		store() // these cascades fail and mark the tier down
	}
	before0 := m.Stats().Tiers[0]
	start := time.Now()
	during := store() // refused at once by the unhealthy tier
	if d := time.Since(start); d > time.Second {
		t.Fatalf("a cascade to the down tier took %v", d)
	}
	st := m.Stats().Tiers[0]
	if st.CascadesFailed != before0.CascadesFailed || st.DroppedBy[tiering.DropTierDown] != before0.DroppedBy[tiering.DropTierDown]+1 {
		t.Fatalf("cascade while down not counted as dropped (tier_down): %+v", st)
	}
	// The primary keeps serving what it has.
	req, _ := offload.NewReqContext("reader", nil)
	m.OnNewRequest(req)
	if r := m.Lookup(during[0], req); r != offload.Hit {
		t.Fatalf("primary block while the tier is down: %v", r)
	}
	// A block only the tier had: Miss at once, not Retry forever.
	if err := m.Reset(ctx); err != nil {
		t.Fatal(err)
	}
	m.OnNewRequest(req)
	if r := m.Lookup(before[0], req); r != offload.Miss {
		t.Fatalf("lookup of a tier-only block while down: %v", r)
	}
	m.OnRequestFinished(req)

	o.Start()
	deadline = time.Now().Add(30 * time.Second)
	for !o.Healthy() {
		if time.Now().After(deadline) {
			t.Fatal("tier not healthy 30s after its server restarted")
		}
		time.Sleep(10 * time.Millisecond)
	}
	okBefore := m.Stats().Tiers[0].CascadesOK
	store()
	if st := m.Stats().Tiers[0]; st.CascadesOK != okBefore+1 {
		t.Fatalf("cascade after recovery %+v", st)
	}
}

// RunManagerDeleteWhere checks a tier that lists what it holds
// (tiering.Lister) under a manager's DeleteWhere: the blocks whose keys
// match leave the tier, the others stay.
func RunManagerDeleteWhere(t *testing.T, c ManagerCase) {
	t.Helper()
	if _, ok := c.Tier.(tiering.Lister); !ok {
		t.Fatalf("%T lists nothing (tiering.Lister)", c.Tier)
	}
	ctx, p, m := c.manager(t, 16)
	keys := Keys(7000, 8)
	storeVia(t, m, p, "writer", "", keys, make([][]byte, len(keys)))
	gone := map[offload.Key]bool{}
	for _, k := range keys[:4] {
		gone[k] = true
	}
	a, listed, err := m.DeleteWhere(ctx, func(k offload.Key) bool { return gone[k] })
	if err != nil {
		t.Fatal(err)
	}
	if listed != 4 || len(a.Tiers) != 1 || a.Tiers[0].Removed != 4 || a.Tiers[0].Err != nil {
		t.Fatalf("delete of 4 of 8 keys: %d listed, %+v", listed, a)
	}
	held := make([]bool, len(keys))
	if h, ok := c.Tier.(tiering.Holder); ok {
		h.Holds(keys, held)
		for i, k := range keys {
			if held[i] == gone[k] {
				t.Fatalf("key %d: held %v after a delete of %v", i, held[i], gone[k])
			}
		}
	}
}
