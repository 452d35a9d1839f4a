package tiering

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/kvtier/kvtier/cpu"
	"github.com/kvtier/kvtier/keyspace"
	"github.com/kvtier/kvtier/offload"
)

// queueFake is a fakeTier whose held jobs wait in a queue until started;
// the manager may withdraw the ones not started.
type queueFake struct {
	*fakeTier
	started   map[uint64]bool
	withdrawn []uint64
	capacity  int
}

func newQueueFake(name string) *queueFake {
	f := newFake(name, offload.MediumStorage, offload.LocalityLocal, nil)
	f.hold = true
	return &queueFake{fakeTier: f, started: map[uint64]bool{}}
}

func (q *queueFake) QueuedJobs() (int, int) {
	n := 0
	for _, j := range q.held {
		if !q.started[j.ID] {
			n++
		}
	}
	return n, q.capacity
}

func (q *queueFake) CancelQueued(id uint64) bool {
	for i, j := range q.held {
		if j.ID == id && !q.started[id] {
			q.held = append(q.held[:i], q.held[i+1:]...)
			q.withdrawn = append(q.withdrawn, id)
			return true
		}
	}
	return false
}

func (q *queueFake) startAll() {
	for _, j := range q.held {
		q.started[j.ID] = true
	}
}

// budgetManager builds a manager over a primary of slots slots and tiers.
func budgetManager(t *testing.T, slots int, b BudgetConfig, tiers ...offload.SecondaryTier) *Manager {
	t.Helper()
	m, err := New(Config{Primary: newPrimary(t, slots), Tiers: tiers, Budget: b, Admission: AdmissionConfig{Disabled: true}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close(t.Context()) })
	return m
}

// endStep ends the step and the next one: results that arrive after a
// step's poll are applied at the next step's (§4.2).
func endStep(m *Manager) {
	m.ScheduleEnd(offload.ScheduleEnd{})
	m.ScheduleEnd(offload.ScheduleEnd{})
}

func storeKeys(t *testing.T, m *Manager, req *offload.ReqContext, keys []offload.Key) bool {
	t.Helper()
	out, ok, err := m.PrepareStore(keys, req)
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		return false
	}
	if err := m.CompleteStore(out.KeysToStore, req, true); err != nil {
		t.Fatal(err)
	}
	return true
}

func TestBudgetLimits(t *testing.T) {
	for _, c := range []struct {
		b             BudgetConfig
		slots, tiers  int
		total, perTir int
	}{
		{BudgetConfig{}, 100, 1, 25, 25},
		{BudgetConfig{}, 100, 3, 25, 13},
		{BudgetConfig{}, 5, 2, 2, 1},
		{BudgetConfig{Fraction: 0.5, TierFraction: 1}, 10, 4, 5, 5},
		{BudgetConfig{Disabled: true}, 100, 2, 0, 0},
		{BudgetConfig{}, 1, 1, 1, 1},
	} {
		total, per := c.b.limits(c.slots, c.tiers)
		if total != c.total || per != c.perTir {
			t.Errorf("%+v over %d slots, %d tiers: limits %d/%d, want %d/%d", c.b, c.slots, c.tiers, total, per, c.total, c.perTir)
		}
	}
	for _, bad := range []BudgetConfig{{Fraction: -0.1}, {Fraction: 1.5}, {TierFraction: 2}} {
		if _, err := New(Config{Primary: newPrimary(t, 4), Budget: bad}); err == nil {
			t.Errorf("budget %+v accepted", bad)
		}
	}
}

// Without deferral a cascade beyond the budget is dropped (counted, the
// blocks stay in the primary), one beyond the tier's share too; with
// nothing in flight one cascade is admitted whatever its size; engine
// stores are not refused.
func TestBudgetDropsCascades(t *testing.T) {
	slow := newFake("slow", offload.MediumStorage, offload.LocalityRemote, nil)
	slow.hold = true
	fast := newFake("fast", offload.MediumCPU, offload.LocalityLocal, nil)
	// 16 slots: budget 4, each tier's share 2.
	m := budgetManager(t, 16, BudgetConfig{MaxDeferred: -1}, slow, fast)
	req := reqWith("r", nil, nil)
	m.OnNewRequest(req)

	if !storeKeys(t, m, req, keyRange(0, 6)) { // over the budget, but nothing in flight
		t.Fatal("store refused")
	}
	if len(slow.stores) != 1 || len(fast.stores) != 1 {
		t.Fatalf("first cascade: %d slow, %d fast jobs, want 1 each", len(slow.stores), len(fast.stores))
	}
	m.ScheduleEnd(offload.ScheduleEnd{}) // fast answered; slow holds its job
	if st := m.Stats(); st.CascadePinned != 6 || st.CascadeBudget != 4 {
		t.Fatalf("pinned %d of %d, want 6 of 4", st.CascadePinned, st.CascadeBudget)
	}
	if !storeKeys(t, m, req, keyRange(6, 8)) {
		t.Fatal("store refused while the budget is spent (engine stores never are)")
	}
	st := m.Stats()
	for _, ts := range st.Tiers {
		if ts.DroppedBy[DropBudget] != 1 || ts.CascadesDropped != 1 || ts.CascadeBlocksDropped != 2 {
			t.Errorf("tier %s: dropped %v (%d jobs, %d blocks), want one budget drop of 2 blocks", ts.Name, ts.DroppedBy, ts.CascadesDropped, ts.CascadeBlocksDropped)
		}
	}
	// The blocks stay in the primary.
	for _, k := range keyRange(6, 8) {
		if r := m.Lookup(k, req); r != offload.Hit {
			t.Errorf("dropped block %v: %v, want HIT in the primary", k, r)
		}
	}
	slow.release()
	endStep(m)
	if st := m.Stats(); st.CascadePinned != 0 || st.Tiers[0].PinnedSlots != 0 || st.Primary.Pinned != 0 {
		t.Fatalf("after the slow tier answered: pinned %d (tier %d, primary %d)", st.CascadePinned, st.Tiers[0].PinnedSlots, st.Primary.Pinned)
	}

	// The tier's share: slow holds 2 blocks (its share), fast is free.
	if !storeKeys(t, m, req, keyRange(8, 10)) {
		t.Fatal("store refused")
	}
	endStep(m) // fast's result is applied
	if !storeKeys(t, m, req, keyRange(10, 11)) {
		t.Fatal("store refused")
	}
	endStep(m)
	st = m.Stats()
	if got := st.Tiers[0].DroppedBy[DropTierBudget]; got != 1 {
		t.Errorf("slow tier: %d tier_budget drops, want 1 (%v)", got, st.Tiers[0].DroppedBy)
	}
	if got := st.Tiers[1].CascadesOK; got != 3 {
		t.Errorf("fast tier: %d cascades ok, want 3 (its share is not the slow tier's)", got)
	}
}

// A tier whose queue is full is not sent a cascade; a job a tier refuses
// counts as dropped with the tier's reason, not as failed.
func TestQueueFullAndRefusalsAreDrops(t *testing.T) {
	q := newQueueFake("q")
	q.capacity = 1
	m := budgetManager(t, 32, BudgetConfig{Disabled: true}, q)
	req := reqWith("r", nil, nil)
	m.OnNewRequest(req)
	storeKeys(t, m, req, keyRange(0, 1))
	storeKeys(t, m, req, keyRange(1, 2))
	st := m.Stats().Tiers[0]
	if len(q.stores) != 1 || st.DroppedBy[DropQueueFull] != 1 || st.Queued != 1 || st.QueueCapacity != 1 {
		t.Fatalf("jobs %d, stats %+v: want 1 job and a queue_full drop", len(q.stores), st)
	}

	r := newFake("r", offload.MediumCPU, offload.LocalityRemote, nil)
	r.hold = true
	m2 := budgetManager(t, 32, BudgetConfig{Disabled: true}, r)
	m2.OnNewRequest(req)
	storeKeys(t, m2, req, keyRange(0, 2))
	storeKeys(t, m2, req, keyRange(2, 4))
	r.held = nil
	r.results = []offload.JobResult{
		{JobID: r.stores[0].ID, Err: offload.Refused(offload.RefusedTierDown, errors.New("down"))},
		{JobID: r.stores[1].ID, Err: offload.Refused(offload.RefusedQueueFull, errors.New("busy"))},
	}
	endStep(m2)
	st = m2.Stats().Tiers[0]
	if st.CascadesFailed != 0 || st.DroppedBy[DropTierDown] != 1 || st.DroppedBy[DropQueueFull] != 1 {
		t.Fatalf("refused jobs: %+v", st)
	}
	if p := m2.Stats().Primary.Pinned; p != 0 {
		t.Fatalf("%d blocks still pinned after refusals", p)
	}
}

// When the primary must evict and only blocks pinned by queued cascades
// remain, the queued cascades are withdrawn (answered once, counted) and
// the store succeeds; a started transfer is never withdrawn.
func TestStoresWinOverQueuedCascades(t *testing.T) {
	q := newQueueFake("q")
	m := budgetManager(t, 4, BudgetConfig{Disabled: true}, q)
	req := reqWith("r", nil, nil)
	m.OnNewRequest(req)
	storeKeys(t, m, req, keyRange(0, 2))
	storeKeys(t, m, req, keyRange(2, 4)) // primary full, every block pinned by a queued cascade
	q.started[q.held[0].ID] = true       // the first transfer is under way
	if !storeKeys(t, m, req, keyRange(4, 6)) {
		t.Fatal("store refused although queued cascades could give way")
	}
	st := m.Stats()
	if st.Primary.Revocations == 0 || st.Tiers[0].DroppedBy[DropCancelled] != 1 || len(q.withdrawn) != 1 {
		t.Fatalf("revocations %d, cancelled %v, withdrawn %v", st.Primary.Revocations, st.Tiers[0].DroppedBy, q.withdrawn)
	}
	if q.withdrawn[0] != q.stores[1].ID {
		t.Errorf("withdrew job %d, want the queued one %d", q.withdrawn[0], q.stores[1].ID)
	}
	// Once every transfer has started, the next store must wait for them,
	// and the primary still serves their blocks.
	q.startAll()
	if storeKeys(t, m, req, keyRange(6, 8)) {
		t.Fatal("store succeeded by tearing a started transfer")
	}
	for _, k := range keyRange(0, 2) {
		if m.Lookup(k, req) != offload.Hit {
			t.Errorf("%v lost while its transfer runs", k)
		}
	}
	q.release()
	endStep(m)
	if !storeKeys(t, m, req, keyRange(6, 8)) {
		t.Fatal("store refused after the transfer ended")
	}
	q.release()
	endStep(m)
	if st := m.Stats(); st.Primary.Pinned != 0 || st.JobsInFlight != 0 {
		t.Fatalf("pins %d, jobs %d left", st.Primary.Pinned, st.JobsInFlight)
	}
}

// Promotions are never refused because of cascades: queued ones give way.
func TestPromotionsWinOverQueuedCascades(t *testing.T) {
	q := newQueueFake("q")
	src := newFake("src", offload.MediumStorage, offload.LocalityLocal, nil)
	src.blocks[K(99)] = true
	m := budgetManager(t, 2, BudgetConfig{Disabled: true}, q, src)
	req := reqWith("r", nil, offload.NewTierFilter(offload.TierMatcher{Medium: offload.MediumStorage}))
	m.OnNewRequest(req)
	storeKeys(t, m, req, keyRange(0, 2)) // full; q queues the cascade, src answers it
	m.ScheduleEnd(offload.ScheduleEnd{})
	if r := m.Lookup(K(99), req); r != offload.Retry {
		t.Fatalf("lookup of a key in src: %v, want RETRY (promotion started)", r)
	}
	if st := m.Stats(); st.Tiers[0].DroppedBy[DropCancelled] != 1 || st.Tiers[1].PromotionsStarted != 1 {
		t.Fatalf("stats %+v", st.Tiers)
	}
}

// Admission sees the queue: a job's latency runs from submission to its
// result, so a tier whose jobs wait in a queue comes under pressure even
// when each transfer is quick.
func TestLatencyFromSubmission(t *testing.T) {
	q := newQueueFake("q")
	m, err := New(Config{Primary: newPrimary(t, 64), Tiers: []offload.SecondaryTier{q},
		Budget: BudgetConfig{Disabled: true}, Admission: AdmissionConfig{Warmup: -1, High: 10 * time.Millisecond, Low: 5 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close(t.Context())
	req := reqWith("r", nil, nil)
	m.OnNewRequest(req)
	storeKeys(t, m, req, keyRange(0, 1))
	// The job waits in the queue; when it runs the tier reports how long
	// it took since submission (as the fs tier does).
	q.dur = 20 * time.Millisecond
	q.release()
	endStep(m)
	st := m.Stats().Tiers[0]
	if !st.UnderPressure || st.CascadeLatencyEMA != 20*time.Millisecond {
		t.Fatalf("pressure %v, ema %v: want pressure from a 20ms submission-to-result latency", st.UnderPressure, st.CascadeLatencyEMA)
	}
	if st.StoreLatency == nil || st.StoreLatency.Count != 1 {
		t.Fatalf("store latency histogram %+v", st.StoreLatency)
	}
}

// Issue 11, finding 9: disk-full and every other cascade failure were
// logged at debug level only. They are warnings now, at most one per tier
// per warnEvery, saying how many were kept quiet.
func TestCascadeFailuresAreWarnings(t *testing.T) {
	var buf bytes.Buffer
	f := newFake("disk", offload.MediumStorage, offload.LocalityLocal, nil)
	f.failStores = true
	m, err := New(Config{Primary: newPrimary(t, 64), Tiers: []offload.SecondaryTier{f},
		Logger: slog.New(slog.NewTextHandler(&buf, nil)), Budget: BudgetConfig{Disabled: true}})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close(t.Context())
	req := reqWith("r", nil, nil)
	m.OnNewRequest(req)
	for i := range 5 {
		storeKeys(t, m, req, keyRange(10*i, 10*i+2))
		endStep(m)
	}
	if got := m.Stats().Tiers[0].CascadesFailed; got != 5 {
		t.Fatalf("%d cascades failed, want 5", got)
	}
	logged := strings.Count(buf.String(), `level=WARN msg="tiering: cascade failed" tier=disk`)
	if logged != 1 {
		t.Fatalf("%d warnings for 5 failures within %v, want 1:\n%s", logged, warnEvery, buf.String())
	}
}

// claimFake is a queueFake whose tier claims blocks (offload.BlockClaimer):
// a held store job stores, when released, only the blocks it can claim.
type claimFake struct{ *queueFake }

func (c claimFake) ClaimsBlocks() bool { return true }

func (c claimFake) release() {
	held := c.held
	c.held = nil
	for _, j := range held {
		r := offload.JobResult{JobID: j.ID, Success: true}
		for i, k := range j.Keys {
			if j.Claim(i) {
				c.blocks[k] = true
				j.Release(i)
			}
		}
		c.results = append(c.results, r)
	}
}

// Eviction takes single blocks back from cascades a tier that claims
// blocks has started: each block no tier is reading gives way where the
// primary alone would have evicted it, the job goes on with its other
// blocks, and a block being read stays until its read ends.
func TestStoresTakeBlocksBackFromStartedCascades(t *testing.T) {
	c := claimFake{newQueueFake("c")}
	m := budgetManager(t, 4, BudgetConfig{Disabled: true}, c)
	req := reqWith("r", nil, nil)
	m.OnNewRequest(req)
	storeKeys(t, m, req, keyRange(0, 2))
	storeKeys(t, m, req, keyRange(2, 4)) // primary full, every block pinned by a cascade
	c.startAll()
	first := c.held[0]
	if !first.Claim(0) { // the tier is writing block 0
		t.Fatal("claim of a block nobody took back failed")
	}
	if !storeKeys(t, m, req, keyRange(4, 6)) {
		t.Fatal("store refused although started cascades could give blocks back")
	}
	for k, want := range map[int]offload.LookupResult{0: offload.Hit, 1: offload.Miss, 2: offload.Miss, 3: offload.Hit} {
		if got := m.Lookup(K(k), req); got != want {
			t.Errorf("lookup %d: %v, want %v (block 0 is being read; 1 and 2 were the oldest others)", k, got, want)
		}
	}
	st := m.Stats()
	if st.Tiers[0].CascadeBlocksRevoked != 2 || st.Tiers[0].CascadesDropped != 0 || len(c.withdrawn) != 0 {
		t.Fatalf("taken back %d, dropped %d, withdrawn %v: want 2 blocks taken back, no job withdrawn",
			st.Tiers[0].CascadeBlocksRevoked, st.Tiers[0].CascadesDropped, c.withdrawn)
	}
	// Pinned: blocks 0 and 3, and the new blocks' own cascade.
	if st.Primary.Pinned != 4 || st.Tiers[0].PinnedSlots != 4 {
		t.Fatalf("pinned %d in the primary, %d counted for the tier; want blocks 0, 3, 4, 5", st.Primary.Pinned, st.Tiers[0].PinnedSlots)
	}
	if pinned, _ := m.stack.Pinned(); pinned != 4 {
		t.Fatalf("budget counts %d pinned slots, want 4", pinned)
	}
	// Block 0 stays while it is read: the next store evicts 3 and 4.
	if !storeKeys(t, m, req, keyRange(6, 8)) {
		t.Fatal("store refused although blocks 3 and 4 could be taken back")
	}
	if m.Lookup(K(0), req) != offload.Hit || m.Lookup(K(3), req) != offload.Miss || m.Lookup(K(4), req) != offload.Miss {
		t.Fatal("the second store did not evict 3 and 4, keeping 0")
	}
	first.Release(0)
	c.release()
	endStep(m)
	for k, want := range map[int]bool{0: true, 1: false, 2: false, 3: false, 4: false, 5: true, 6: true, 7: true} {
		if c.blocks[K(k)] != want {
			t.Errorf("tier holds %d: %v, want %v (a block taken back is not stored)", k, c.blocks[K(k)], want)
		}
	}
	st = m.Stats()
	if st.Primary.Pinned != 0 || st.JobsInFlight != 0 || st.Tiers[0].PinnedSlots != 0 ||
		st.Tiers[0].CascadedBlocks != 4 || st.Tiers[0].CascadeBlocksRevoked != 4 {
		t.Fatalf("after the jobs: pins %d, jobs %d, tier pins %d, cascaded %d, taken back %d",
			st.Primary.Pinned, st.JobsInFlight, st.Tiers[0].PinnedSlots, st.Tiers[0].CascadedBlocks, st.Tiers[0].CascadeBlocksRevoked)
	}
	if pinned, _ := m.stack.Pinned(); pinned != 0 {
		t.Fatalf("budget counts %d pinned slots after the jobs", pinned)
	}
}

// An engine that binds leased stores in bursts (SGLang's backup thread)
// has a burst's cascade admitted once the previous one has ended, even
// when no poll has collected that end yet: the daemon's step tops the
// lease pool up after its step end (the lease polls, closing the step's
// gate), and an idle engine's auto step then ends the step without
// polling. Bind polls first, as Lease does.
func TestBindAfterAnEndedCascadeIsAdmitted(t *testing.T) {
	disk := newFake("disk", offload.MediumStorage, offload.LocalityLocal, nil)
	disk.hold = true
	m := budgetManager(t, 16, BudgetConfig{}, disk) // budget 4
	req := reqWith("r", nil, nil)
	m.OnNewRequest(req)
	lease := func(n int) []int64 {
		t.Helper()
		slots, _, err := m.Lease(n)
		if err != nil || len(slots) != n {
			t.Fatalf("lease %d: %v, %v", n, slots, err)
		}
		return slots
	}
	bind := func(keys []offload.Key, slots []int64) {
		t.Helper()
		if n, err := m.Bind(keys, slots, req, true); err != nil || n != len(keys) {
			t.Fatalf("bind: %d, %v", n, err)
		}
	}
	bind(keyRange(0, 4), lease(4)) // a daemon step: stores, step end, top-up
	m.ScheduleEnd(offload.ScheduleEnd{})
	next := lease(4)
	disk.release()                       // the cascade ends
	m.ScheduleEnd(offload.ScheduleEnd{}) // an auto step: the gate was closed by the lease
	bind(keyRange(4, 8), next)
	st := m.Stats().Tiers[0]
	if st.CascadesDropped != 0 || len(disk.stores) != 2 {
		t.Fatalf("second burst: %d jobs, dropped %v; want it cascaded", len(disk.stores), st.DroppedBy)
	}
}

// With tenants (a primary with shares) each tenant's cascades pin at most
// its quota's share of the budget: one tenant flooding a slow tier does
// not keep the other's blocks from cascading.
func TestBudgetTenantShares(t *testing.T) {
	acme, _ := keyspace.New("acme")
	beta, _ := keyspace.New("beta")
	p, err := cpu.New(cpu.Config{SlotSize: testSlotSize, Capacity: 40 * testSlotSize, Events: true,
		Shares: []cpu.Share{{Space: acme.ID(), Slots: 20}, {Space: beta.ID(), Slots: 20}}})
	if err != nil {
		t.Fatal(err)
	}
	slow := newFake("slow", offload.MediumStorage, offload.LocalityRemote, nil)
	slow.hold = true
	// 40 slots: budget 10, each tenant's share 5 (the pool's quota is 0).
	m, err := New(Config{Primary: p, Tiers: []offload.SecondaryTier{slow}, Admission: AdmissionConfig{Disabled: true}, Budget: BudgetConfig{MaxDeferred: -1}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close(t.Context()) })
	req := reqWith("r", nil, nil)
	m.OnNewRequest(req)
	tagged := func(sp keyspace.Space, from, n int) []offload.Key {
		var ks []offload.Key
		for _, k := range keyRange(from, from+n) {
			ks = append(ks, sp.Key([]byte(k)))
		}
		return ks
	}
	// beta floods: its first 4 blocks cascade, the next batch would pass
	// its share of 5 and is dropped.
	storeKeys(t, m, req, tagged(beta, 0, 4))
	storeKeys(t, m, req, tagged(beta, 4, 2))
	// acme's cascade still goes, though the budget is not spent.
	storeKeys(t, m, req, tagged(acme, 0, 4))
	st := m.Stats()
	if got := st.Tiers[0].DroppedBy[DropTenantBudget]; got != 1 {
		t.Fatalf("tenant_budget drops %d, want 1 (beta's second batch): %v", got, st.Tiers[0].DroppedBy)
	}
	if len(slow.stores) != 2 || st.CascadePinned != 8 {
		t.Fatalf("%d cascades in flight pinning %d slots, want beta's first and acme's (8)", len(slow.stores), st.CascadePinned)
	}
	slow.release()
	endStep(m)
	if st := m.Stats(); st.CascadePinned != 0 {
		t.Fatalf("pinned %d after the tier answered", st.CascadePinned)
	}
	// With its cascades ended, beta cascades again.
	storeKeys(t, m, req, tagged(beta, 6, 2))
	if len(slow.stores) != 3 {
		t.Fatalf("beta's cascade after its share freed up: %d jobs, want 3", len(slow.stores))
	}
}
