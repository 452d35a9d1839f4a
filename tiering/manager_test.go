package tiering

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/tiers/memory"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Cases 11 and 12 (docs/semantics.md §7.B): the load filter decides whether secondary 1
// (medium CPU) is asked at all.
func TestLoadFilterIntegration(t *testing.T) {
	for _, tc := range []struct {
		name   string
		filter *offload.TierFilter
		want   offload.LookupResult
		asked  bool
	}{
		{"11/storage", offload.NewTierFilter(offload.TierMatcher{Medium: offload.MediumStorage}), offload.Miss, false},
		{"11/deny-all", offload.NewTierFilter(), offload.Miss, false},
		{"12/all", offload.All(), offload.Retry, true},
		{"12/cpu", offload.NewTierFilter(offload.TierMatcher{Medium: offload.MediumCPU}), offload.Retry, true},
		{"12/unconstrained", offload.NewTierFilter(offload.TierMatcher{}), offload.Retry, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			req := reqWith("r", tc.filter, nil)
			f.m.OnNewRequest(req)
			f.store(req, []offload.Key{K(0)})
			f.t1.blocks[K(1)] = true
			f.t1.lookups = nil
			if got := f.m.Lookup(K(0), req); got != offload.Hit {
				t.Errorf("lookup(b0) = %v, want HIT (primary is never filtered)", got)
			}
			if got := f.m.Lookup(K(1), req); got != tc.want {
				t.Errorf("lookup(b1) = %v, want %v", got, tc.want)
			}
			if asked := len(f.t1.lookups) > 0; asked != tc.asked {
				t.Errorf("secondary 1 asked = %v (%d calls), want %v", asked, len(f.t1.lookups), tc.asked)
			}
			st := f.m.Stats().Tiers[0]
			if !tc.asked && st.SkippedByFilter == 0 {
				t.Errorf("skipped_by_filter not counted: %+v", st)
			}
		})
	}
}

// Cases 13–35 (docs/semantics.md §7.C), on the upstream fixture: a 5-slot primary and
// two recording tiers.
func TestCoreBehaviour(t *testing.T) {
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, f *fixture)
	}{
		{"13 take_events order", func(t *testing.T, f *fixture) {
			f.m.OnNewRequest(f.ctx)
			f.store(f.ctx, []offload.Key{K(0)})
			f.t1.events = []offload.Event{{Keys: []offload.Key{K(1)}, Tier: "1"}}
			f.t2.events = []offload.Event{{Keys: []offload.Key{K(2)}, Tier: "2"}}
			got := f.m.TakeEvents()
			want := []offload.Event{
				{Keys: []offload.Key{K(0)}, Medium: offload.MediumCPU},
				{Keys: []offload.Key{K(1)}, Tier: "1"},
				{Keys: []offload.Key{K(2)}, Tier: "2"},
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("events (-want +got):\n%s", diff)
			}
			if f.t1.takeEvents != 1 || f.t2.takeEvents != 1 {
				t.Errorf("take_events calls %d, %d; want 1 each", f.t1.takeEvents, f.t2.takeEvents)
			}
		}},
		{"14 basic store", func(t *testing.T, f *fixture) {
			f.m.OnNewRequest(f.ctx)
			out := f.store(f.ctx, keyRange(0, 3))
			if len(out.KeysToStore) != 3 {
				t.Fatalf("keys to store %v", out.KeysToStore)
			}
			for _, k := range keyRange(0, 3) {
				if got := f.p.Lookup(k); got != offload.Hit {
					t.Errorf("primary lookup %v = %v", k, got)
				}
			}
		}},
		{"15 cascade", func(t *testing.T, f *fixture) {
			f.m.OnNewRequest(f.ctx)
			f.store(f.ctx, keyRange(0, 3))
			for _, tier := range []*fakeTier{f.t1, f.t2} {
				if len(tier.stores) != 1 || len(tier.blocks) != 3 {
					t.Errorf("tier %s: %d submit_store, %d blocks", tier.name, len(tier.stores), len(tier.blocks))
				}
				for _, k := range keyRange(0, 3) {
					if tier.Lookup(k, f.ctx) != offload.Hit {
						t.Errorf("tier %s lookup %v not HIT", tier.name, k)
					}
				}
			}
		}},
		{"16 ref_cnt protection", func(t *testing.T, f *fixture) {
			f.m.OnNewRequest(f.ctx)
			f.store(f.ctx, keyRange(0, 3))
			for _, k := range keyRange(0, 3) {
				if r := f.ref(k); r != 2 {
					t.Fatalf("after complete_store ref(%v) = %d, want 2", k, r)
				}
			}
			f.step()
			for _, k := range keyRange(0, 3) {
				if r := f.ref(k); r != 2 {
					t.Fatalf("after one step ref(%v) = %d, want 2 (gate set by prepare_store)", k, r)
				}
			}
			if len(f.t1.results) != 1 || len(f.t2.results) != 1 {
				t.Fatalf("tiers should still hold completed results: %d, %d", len(f.t1.results), len(f.t2.results))
			}
			f.step()
			for _, k := range keyRange(0, 3) {
				if r := f.ref(k); r != 0 {
					t.Fatalf("after two steps ref(%v) = %d, want 0", k, r)
				}
			}
			if len(f.t1.results) != 0 || len(f.t2.results) != 0 {
				t.Fatal("completed results not drained")
			}
		}},
		{"17 lookup from primary", func(t *testing.T, f *fixture) {
			f.m.OnNewRequest(f.ctx)
			f.store(f.ctx, keyRange(0, 3))
			if diff := cmp.Diff(rs(offload.Hit, offload.Hit, offload.Hit), f.lookups(f.ctx, keyRange(0, 3))); diff != "" {
				t.Error(diff)
			}
		}},
		{"18 promotion", func(t *testing.T, f *fixture) {
			for _, k := range keyRange(0, 3) {
				f.t1.blocks[k] = true
			}
			if diff := cmp.Diff(rs(offload.Retry, offload.Retry, offload.Retry), f.lookups(f.ctx, keyRange(0, 3))); diff != "" {
				t.Fatal(diff)
			}
			f.step()
			f.step()
			for _, k := range keyRange(0, 3) {
				if f.p.Lookup(k) != offload.Hit {
					t.Errorf("%v not HIT in primary", k)
				}
			}
			if diff := cmp.Diff(rs(offload.Hit, offload.Hit, offload.Hit), f.lookups(f.ctx, keyRange(0, 3))); diff != "" {
				t.Error(diff)
			}
			if st := f.m.Stats().Tiers[0]; st.PromotionsOK != 1 || st.PromotedBlocks != 3 {
				t.Errorf("stats %+v", st)
			}
		}},
		{"19 partial lookup", func(t *testing.T, f *fixture) {
			f.m.OnNewRequest(f.ctx)
			f.store(f.ctx, keyRange(0, 3))
			out := make([]offload.LookupResult, 5)
			if n := f.m.LookupPrefix(keyRange(0, 5), f.ctx, out); n != 3 {
				t.Errorf("hits = %d, want 3", n)
			}
			if diff := cmp.Diff(rs(offload.Hit, offload.Hit, offload.Hit, offload.Miss, offload.Miss), out); diff != "" {
				t.Error(diff)
			}
		}},
		{"20 eviction", func(t *testing.T, f *fixture) {
			f.m.OnNewRequest(f.ctx)
			f.store(f.ctx, keyRange(0, 5))
			f.step()
			out, ok, err := f.m.PrepareStore(keyRange(5, 7), f.ctx)
			if err != nil || !ok {
				t.Fatalf("prepare store: ok=%v err=%v", ok, err)
			}
			if len(out.Evicted) != 2 || len(out.KeysToStore) != 2 {
				t.Errorf("evicted %v, to store %v", out.Evicted, out.KeysToStore)
			}
		}},
		{"21 touch", func(t *testing.T, f *fixture) {
			f.m.OnNewRequest(f.ctx)
			f.store(f.ctx, keyRange(0, 3))
			f.store(f.ctx, keyRange(3, 5))
			f.step()
			f.step()
			f.m.Touch(keyRange(0, 3), f.ctx)
			for _, tier := range []*fakeTier{f.t1, f.t2} {
				if diff := cmp.Diff([][]offload.Key{keyRange(0, 3)}, tier.touches); diff != "" || tier.touchReqs[0] != f.ctx {
					t.Errorf("tier %s touches: %s", tier.name, diff)
				}
			}
			// The evictable order now ends K2, K1, K0 after K3, K4: new
			// stores evict K3, K4, then K2, K1, K0 in that order.
			var evicted []offload.Key
			for i := 10; i < 15; i++ {
				f.step()
				out, ok, err := f.m.PrepareStore([]offload.Key{K(i)}, f.ctx)
				if err != nil || !ok {
					t.Fatalf("prepare store: ok=%v err=%v", ok, err)
				}
				evicted = append(evicted, out.Evicted...)
				if err := f.m.CompleteStore(out.KeysToStore, f.ctx, true); err != nil {
					t.Fatal(err)
				}
				f.step()
			}
			if diff := cmp.Diff([]offload.Key{K(3), K(4), K(2), K(1), K(0)}, evicted); diff != "" {
				t.Errorf("eviction order (-want +got):\n%s", diff)
			}
		}},
		{"22 failed store", func(t *testing.T, f *fixture) {
			f.m.OnNewRequest(f.ctx)
			out, _, _ := f.m.PrepareStore(keyRange(0, 3), f.ctx)
			if err := f.m.CompleteStore(out.KeysToStore, f.ctx, false); err != nil {
				t.Fatal(err)
			}
			if len(f.t1.stores)+len(f.t2.stores) != 0 {
				t.Error("a failed store cascaded")
			}
		}},
		{"23 batched promotions", func(t *testing.T, f *fixture) {
			a, b := reqWith("a", nil, nil), reqWith("b", nil, nil)
			for _, k := range keyRange(0, 4) {
				f.t1.blocks[k] = true
			}
			got := append(f.lookups(a, keyRange(0, 2)), f.lookups(b, keyRange(2, 4))...)
			if diff := cmp.Diff(rs(offload.Retry, offload.Retry, offload.Retry, offload.Retry), got); diff != "" {
				t.Fatal(diff)
			}
			if len(f.t1.loads) != 0 {
				t.Fatal("submit_load called during lookups")
			}
			f.step()
			if len(f.t1.loads) != 2 {
				t.Fatalf("%d submit_load calls, want 2", len(f.t1.loads))
			}
			if diff := cmp.Diff(keyRange(0, 2), f.t1.loads[0].Keys); diff != "" || f.t1.loads[0].Req != a {
				t.Errorf("first load: %s req %p", diff, f.t1.loads[0].Req)
			}
			if diff := cmp.Diff(keyRange(2, 4), f.t1.loads[1].Keys); diff != "" || f.t1.loads[1].Req != b {
				t.Errorf("second load: %s req %p", diff, f.t1.loads[1].Req)
			}
			if f.t1.loads[0].ID == f.t1.loads[1].ID {
				t.Error("job ids not unique")
			}
		}},
		{"24 shared block", func(t *testing.T, f *fixture) {
			a, b := reqWith("a", nil, nil), reqWith("b", nil, nil)
			f.t1.blocks[K(0)] = true
			if got := f.m.Lookup(K(0), a); got != offload.Retry {
				t.Errorf("req a: %v, want RETRY", got)
			}
			if got := f.m.Lookup(K(0), b); got != offload.HitPending {
				t.Errorf("req b: %v, want HIT_PENDING", got)
			}
			f.step()
			if len(f.t1.loads) != 1 || len(f.t1.loads[0].Keys) != 1 || f.t1.loads[0].Keys[0] != K(0) || f.t1.loads[0].Req != a {
				t.Errorf("loads %+v", f.t1.loads)
			}
		}},
		{"25 ctx forwarded to submit_store", func(t *testing.T, f *fixture) {
			req, err := offload.NewReqContext("p", map[string]any{"custom": "value"})
			if err != nil {
				t.Fatal(err)
			}
			f.m.OnNewRequest(req)
			f.store(req, keyRange(0, 1))
			for _, tier := range []*fakeTier{f.t1, f.t2} {
				var custom string
				if len(tier.stores) != 1 || tier.stores[0].Req != req {
					t.Errorf("tier %s did not get the request's context", tier.name)
				} else if ok, _ := tier.stores[0].Req.Param("custom", &custom); !ok || custom != "value" {
					t.Errorf("tier %s did not get the request's context", tier.name)
				}
			}
		}},
		{"26 finalization order", func(t *testing.T, f *fixture) {
			f.m.OnNewRequest(f.ctx)
			out, _, _ := f.m.PrepareStore(keyRange(0, 2), f.ctx)
			f.m.OnRequestFinished(f.ctx)
			if len(f.log.calls) != 0 {
				t.Fatalf("finish with a pending store reached secondaries: %v", f.log.calls)
			}
			if err := f.m.CompleteStore(out.KeysToStore, f.ctx, true); err != nil {
				t.Fatal(err)
			}
			want := []string{"submit_store_1", "submit_store_2", "secondary_finish_1", "secondary_finish_2"}
			if diff := cmp.Diff(want, f.log.calls); diff != "" {
				t.Errorf("order (-want +got):\n%s", diff)
			}
			if f.m.Stats().Requests != 0 {
				t.Error("request state left")
			}
		}},
		{"27 failed store of finished request", func(t *testing.T, f *fixture) {
			f.m.OnNewRequest(f.ctx)
			out, _, _ := f.m.PrepareStore(keyRange(0, 2), f.ctx)
			f.m.OnRequestFinished(f.ctx)
			if err := f.m.CompleteStore(out.KeysToStore, f.ctx, false); err != nil {
				t.Fatal(err)
			}
			want := []string{"secondary_finish_1", "secondary_finish_2"}
			if diff := cmp.Diff(want, f.log.calls); diff != "" {
				t.Errorf("calls (-want +got):\n%s", diff)
			}
			if f.t1.finishedReqs[0] != f.ctx || f.t2.finishedReqs[0] != f.ctx {
				t.Error("finish not called with the request's context")
			}
			if f.m.Stats().Requests != 0 {
				t.Error("request state left")
			}
		}},
		{"28 request without stores", func(t *testing.T, f *fixture) {
			f.m.OnNewRequest(f.ctx)
			f.m.OnRequestFinished(f.ctx)
			if len(f.t1.finishedReqs) != 1 || len(f.t2.finishedReqs) != 1 || f.m.Stats().Requests != 0 {
				t.Errorf("finalised %d, %d; requests %d", len(f.t1.finishedReqs), len(f.t2.finishedReqs), f.m.Stats().Requests)
			}
		}},
		// kvtier's Reset keeps what the engine holds (issue 11: a reset
		// must never free a slot a client still writes), so unlike spec
		// §4.9 a finished request's store in flight survives it and the
		// request is finalised when that store completes.
		{"29 reset keeps a finished request's store in flight", func(t *testing.T, f *fixture) {
			f.m.OnNewRequest(f.ctx)
			out, _, _ := f.m.PrepareStore(keyRange(0, 2), f.ctx)
			f.m.OnRequestFinished(f.ctx)
			if err := f.m.Reset(context.Background()); err != nil {
				t.Fatal(err)
			}
			if len(f.t1.finishedReqs) != 0 || f.m.Stats().Requests != 1 || f.m.Stats().Primary.Pending != 2 {
				t.Fatalf("after reset: finalised %d, requests %d, pending %d", len(f.t1.finishedReqs), f.m.Stats().Requests, f.m.Stats().Primary.Pending)
			}
			if err := f.m.CompleteStore(out.KeysToStore, f.ctx, true); err != nil {
				t.Fatal(err)
			}
			if len(f.t1.finishedReqs) != 1 || len(f.t2.finishedReqs) != 1 || f.m.Stats().Requests != 0 {
				t.Errorf("finalised %d, %d; requests %d", len(f.t1.finishedReqs), len(f.t2.finishedReqs), f.m.Stats().Requests)
			}
		}},
		{"pending stores are counted in keys, not calls", func(t *testing.T, f *fixture) {
			f.m.OnNewRequest(f.ctx)
			f.m.PrepareStore(keyRange(0, 2), f.ctx)
			f.m.PrepareStore(keyRange(2, 4), f.ctx)
			f.m.OnRequestFinished(f.ctx)
			// One call abandons both reservations (a session's release
			// does this); a part completed first must not finalize.
			if err := f.m.CompleteStore(keyRange(0, 1), f.ctx, true); err != nil {
				t.Fatal(err)
			}
			if len(f.t1.finishedReqs) != 0 {
				t.Fatal("finalised with three reserved slots unresolved")
			}
			if err := f.m.CompleteStore(keyRange(1, 4), f.ctx, false); err != nil {
				t.Fatal(err)
			}
			if len(f.t1.finishedReqs) != 1 || f.m.Stats().Requests != 0 {
				t.Fatalf("finalised %d, requests %d; want the request finalized once", len(f.t1.finishedReqs), f.m.Stats().Requests)
			}
		}},
		{"30 reset keeps active request", func(t *testing.T, f *fixture) {
			f.m.OnNewRequest(f.ctx)
			f.m.PrepareStore(keyRange(0, 2), f.ctx)
			if err := f.m.Reset(context.Background()); err != nil {
				t.Fatal(err)
			}
			if rs := f.m.reqs["test"]; rs == nil || rs.pendingStores != 2 {
				t.Fatalf("request state %+v, want its store still pending", rs)
			}
			if len(f.t1.finishedReqs) != 0 {
				t.Fatal("active request finalised")
			}
			if err := f.m.CompleteStore(keyRange(0, 2), f.ctx, true); err != nil {
				t.Fatal(err)
			}
			if f.lookups(f.ctx, keyRange(0, 2))[0] != offload.Hit {
				t.Fatal("the store that survived the reset is not readable")
			}
			f.m.OnRequestFinished(f.ctx)
			if len(f.t1.finishedReqs) != 1 || len(f.t2.finishedReqs) != 1 || f.m.Stats().Requests != 0 {
				t.Error("request not finalised normally after reset")
			}
		}},
		{"31 on_new_request policy", func(t *testing.T, f *fixture) {
			if p := f.m.OnNewRequest(f.ctx); p != offload.BlockLevel || f.m.reqs["test"].requestLevel != 0 {
				t.Errorf("default policy %v", p)
			}
			f.t1.policy = offload.RequestLevel
			r := reqWith("rl", nil, nil)
			if p := f.m.OnNewRequest(r); p != offload.RequestLevel || f.m.reqs["rl"].requestLevel != 1 {
				t.Errorf("policy %v, request-level tiers %b", p, f.m.reqs["rl"].requestLevel)
			}
			f.m.OnRequestFinished(r)
			if _, ok := f.m.reqs["rl"]; ok {
				t.Error("state left after finish")
			}
		}},
		{"32 request-level early cascade", func(t *testing.T, f *fixture) {
			f.m.OnNewRequest(f.ctx)
			f.store(f.ctx, keyRange(0, 3))
			f.step()
			f.step()
			f.t1.stores, f.t2.stores = nil, nil
			f.t1.policy = offload.RequestLevel
			r := reqWith("rl", nil, nil)
			f.m.OnNewRequest(r)
			out, ok, err := f.m.PrepareStore(keyRange(0, 5), r)
			if err != nil || !ok {
				t.Fatal(ok, err)
			}
			if diff := cmp.Diff(keyRange(3, 5), out.KeysToStore); diff != "" {
				t.Errorf("keys to store: %s", diff)
			}
			if len(f.t1.stores) != 1 || !cmp.Equal(keyRange(0, 3), f.t1.stores[0].Keys) {
				t.Errorf("tier 1 stores %+v", f.t1.stores)
			}
			if len(f.t2.stores) != 0 {
				t.Error("block-level tier 2 got the early cascade")
			}
		}},
		{"33 reset clears jobs, promotions and gate", func(t *testing.T, f *fixture) {
			f.m.OnNewRequest(f.ctx)
			f.store(f.ctx, keyRange(0, 2)) // cascades in flight
			f.t1.blocks[K(9)] = true
			if got := f.m.Lookup(K(9), f.ctx); got != offload.Retry { // pending promotion
				t.Fatalf("lookup = %v", got)
			}
			if err := f.m.Reset(context.Background()); err != nil {
				t.Fatal(err)
			}
			st := f.m.Stats()
			if st.JobsInFlight != 0 || st.PendingPromotions != 0 || f.m.polled || st.Requests != 1 {
				t.Errorf("after reset: %+v polled=%v", st, f.m.polled)
			}
			if st.Primary.Blocks != 0 || st.Primary.FreeSlots != 5 {
				t.Errorf("primary not empty: %+v", st.Primary)
			}
			f.step()
			if len(f.t1.loads) != 0 {
				t.Error("dropped promotion was submitted")
			}
			f.t1.blocks = map[offload.Key]bool{}
			f.t2.blocks = map[offload.Key]bool{}
			if diff := cmp.Diff(rs(offload.Miss, offload.Miss), f.lookups(f.ctx, keyRange(0, 2))); diff != "" {
				t.Error(diff)
			}
			out, ok, _ := f.m.PrepareStore(keyRange(20, 25), f.ctx)
			if !ok || len(out.Slots) != 5 {
				t.Errorf("a store of the whole primary after reset: ok %v, slots %v", ok, out.Slots)
			}
		}},
		{"34 reset drains every tier once", func(t *testing.T, f *fixture) {
			f.t1.hold, f.t2.hold = true, true
			f.m.OnNewRequest(f.ctx)
			f.store(f.ctx, keyRange(0, 2))
			if err := f.m.Reset(context.Background()); err != nil {
				t.Fatal(err)
			}
			if f.t1.drains != 1 || f.t2.drains != 1 || f.m.stack.InFlight() != 0 {
				t.Errorf("drains %d, %d; jobs %d", f.t1.drains, f.t2.drains, f.m.stack.InFlight())
			}
			if st := f.m.Stats(); st.Tiers[0].CascadesOK != 1 || st.Tiers[0].UnknownJobs != 0 {
				t.Errorf("drained results not processed: %+v", st.Tiers[0])
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, newFixture(t)) })
	}
}

// Case 35: with no secondary tier the manager behaves like the primary.
func TestNoSecondaryTiers(t *testing.T) {
	p := newPrimary(t, 5)
	m, err := New(Config{Primary: p})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close(context.Background())
	req := reqWith("r", nil, nil)
	m.OnNewRequest(req)
	out, ok, err := m.PrepareStore(keyRange(0, 3), req)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	if err := m.CompleteStore(out.KeysToStore, req, true); err != nil {
		t.Fatal(err)
	}
	if n := m.LookupPrefix(keyRange(0, 3), req, nil); n != 3 {
		t.Errorf("hits %d", n)
	}
	if m.HasPendingWork() {
		t.Error("pending work with no tiers")
	}
}

// Case 36 through the manager: a memory tier holding K0 and K1.
func TestMemoryTierThroughManager(t *testing.T) {
	p := newPrimary(t, 5)
	tier, err := memory.New(memory.Config{Medium: offload.MediumCPU})
	if err != nil {
		t.Fatal(err)
	}
	m, err := New(Config{Primary: p, Tiers: []offload.SecondaryTier{tier}})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close(context.Background())
	req := reqWith("r", nil, nil)
	if got := m.Lookup(K(0), req); got != offload.Miss {
		t.Fatalf("empty: %v", got)
	}
	tier.Put(K(0), make([]byte, testSlotSize))
	tier.Put(K(1), make([]byte, testSlotSize))
	out := make([]offload.LookupResult, 3)
	m.LookupPrefix(keyRange(0, 3), req, out)
	if diff := cmp.Diff(rs(offload.Retry, offload.Retry, offload.Miss), out); diff != "" {
		t.Error(diff)
	}
	m.ScheduleEnd(offload.ScheduleEnd{})
	m.ScheduleEnd(offload.ScheduleEnd{})
	m.LookupPrefix(keyRange(0, 3), req, out)
	if diff := cmp.Diff(rs(offload.Hit, offload.Hit, offload.Miss), out); diff != "" {
		t.Error(diff)
	}
}

// readOnlyTier is a memory tier that declares it takes no stores.
type readOnlyTier struct{ *memory.Tier }

func (readOnlyTier) ReadOnly() bool { return true }

// A read-only tier (a peer tier without push) is looked up and promoted
// from, but never sent a cascade; the other tiers still are.
func TestReadOnlyTierGetsNoCascades(t *testing.T) {
	p := newPrimary(t, 5)
	ro, err := memory.New(memory.Config{Name: "peer", Medium: offload.MediumCPU})
	if err != nil {
		t.Fatal(err)
	}
	rw, err := memory.New(memory.Config{Name: "disk", Medium: offload.MediumStorage})
	if err != nil {
		t.Fatal(err)
	}
	m, err := New(Config{Primary: p, Tiers: []offload.SecondaryTier{readOnlyTier{ro}, rw}})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close(context.Background())
	req := reqWith("r", nil, nil)
	m.OnNewRequest(req)
	if !storeKeys(t, m, req, keyRange(0, 3)) {
		t.Fatal("no room for 3 blocks")
	}
	for m.HasPendingWork() {
		m.ScheduleEnd(offload.ScheduleEnd{})
	}
	st := m.Stats()
	if ro.Len() != 0 || st.Tiers[0].CascadesOK+st.Tiers[0].CascadesDropped+st.Tiers[0].CascadesSkippedByFilter != 0 {
		t.Errorf("read-only tier got cascades: holds %d, stats %+v", ro.Len(), st.Tiers[0])
	}
	if rw.Len() != 3 || st.Tiers[1].CascadedBlocks != 3 {
		t.Errorf("writable tier holds %d, stats %+v", rw.Len(), st.Tiers[1])
	}
	// It still serves lookups.
	ro.Put(K(9), make([]byte, testSlotSize))
	m.Lookup(K(9), req)
	m.ScheduleEnd(offload.ScheduleEnd{})
	if got := m.Lookup(K(9), req); got == offload.Miss {
		t.Errorf("read-only tier not looked up: %v", got)
	}
}

// A key asked again while an earlier tier is not sure yet counts one
// miss for each tier that missed, when the answer is final — not one per
// ask (a memory tier behind an fs tier counted three misses per key).
func TestLookupCountsOneMissPerFinalAnswer(t *testing.T) {
	f := newFixture(t)
	f.t1.retry, f.t2.retry = true, false
	req := reqWith("r", offload.All(), nil)
	f.m.OnNewRequest(req)
	for i := 0; i < 3; i++ {
		if got := f.m.Lookup(K(7), req); got != offload.Retry {
			t.Fatalf("ask %d: %v, want RETRY while tier 1 is not sure", i, got)
		}
	}
	f.t1.retry = false
	if got := f.m.Lookup(K(7), req); got != offload.Miss {
		t.Fatalf("final ask: %v, want MISS", got)
	}
	st := f.m.Stats().Tiers
	if st[0].Retries != 3 || st[0].Misses != 1 || st[1].Misses != 1 {
		t.Fatalf("tier 1 retries %d misses %d, tier 2 misses %d; want 3, 1, 1", st[0].Retries, st[0].Misses, st[1].Misses)
	}
	// A hit in a later tier is final too (the manager promotes the
	// block): the tiers before it missed once.
	f.t2.blocks[K(8)] = true
	f.m.Lookup(K(8), req)
	if st := f.m.Stats().Tiers; st[0].Misses != 2 || st[1].Hits != 1 {
		t.Fatalf("after the hit: tier 1 misses %d, tier 2 hits %d; want 2, 1", st[0].Misses, st[1].Hits)
	}
}

// A cascade whose tier refused some blocks (their cluster node down)
// counts them as dropped, not cascaded; the job itself is OK.
func TestCascadeRefusedBlocksAreDropped(t *testing.T) {
	f := newFixture(t)
	f.t1.refuse = map[offload.Key]bool{K(1): true}
	f.m.OnNewRequest(f.ctx)
	f.store(f.ctx, keyRange(0, 3))
	for f.m.HasPendingWork() {
		f.step()
	}
	st := f.m.Stats().Tiers
	if st[0].CascadesOK != 1 || st[0].CascadedBlocks != 2 || st[0].CascadeBlocksDropped != 1 || st[0].CascadesDropped != 0 {
		t.Fatalf("tier 1: %+v, want 1 cascade of 2 blocks and 1 block dropped", st[0])
	}
	if st[1].CascadedBlocks != 3 || st[1].CascadeBlocksDropped != 0 {
		t.Fatalf("tier 2: %+v", st[1])
	}
}
