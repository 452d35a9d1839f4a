package tiering

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/tiers/memory"
)

// storeFixture has one CPU tier and one STORAGE tier.
func storeFixture(t *testing.T) *fixture {
	f := newFixture(t)
	f.t2.medium, f.t2.locality = offload.MediumStorage, offload.LocalityLocal
	m, err := New(Config{Primary: f.p, Tiers: []offload.SecondaryTier{f.t1, f.t2}})
	if err != nil {
		t.Fatal(err)
	}
	f.m = m
	return f
}

func TestStoreFilter(t *testing.T) {
	storageOnly := offload.NewTierFilter(offload.TierMatcher{Medium: offload.MediumStorage})
	for _, tc := range []struct {
		name       string
		defStore   *offload.TierFilter
		params     string
		to1, to2   bool
		fromReq    bool
		earlyTier1 bool // tier 1 asks for request-level stores
	}{
		{name: "no key, no default", params: `{}`, to1: true, to2: true},
		{name: "storage only", params: `{"kv_store_tiers":[{"medium":"storage"}]}`, to2: true, fromReq: true},
		{name: "cpu only", params: `{"kv_store_tiers":[{"medium":"CPU"}]}`, to1: true, fromReq: true},
		{name: "empty list", params: `{"kv_store_tiers":[]}`, fromReq: true},
		{name: "remote only excludes both", params: `{"kv_store_tiers":[{"locality":"remote"}]}`, to1: true, fromReq: true}, // tier 1 is dynamic on locality
		{name: "default applies when omitted", defStore: storageOnly, params: `{"kv_load_tiers":[]}`, to2: true},
		{name: "default applies when null", defStore: storageOnly, params: `{"kv_store_tiers":null}`, to2: true},
		{name: "request overrides default", defStore: storageOnly, params: `{"kv_store_tiers":[{"medium":"cpu"}]}`, to1: true, fromReq: true},
		{name: "empty list overrides default", defStore: offload.All(), params: `{"kv_store_tiers":[]}`, fromReq: true},
		{name: "invalid list fails open", params: `{"kv_store_tiers":"storage"}`, to1: true, to2: true, fromReq: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := storeFixture(t)
			p := offload.Parser{DefaultStore: tc.defStore}
			req, err := p.NewReqContext("r", tc.params)
			if err != nil {
				t.Fatal(err)
			}
			if req.StoreFromRequest != tc.fromReq {
				t.Fatalf("StoreFromRequest = %v", req.StoreFromRequest)
			}
			f.m.OnNewRequest(req)
			f.store(req, keyRange(0, 2))
			if got := f.m.Lookup(K(0), req); got != offload.Hit {
				t.Errorf("primary did not store: %v", got)
			}
			if got := len(f.t1.stores) == 1; got != tc.to1 {
				t.Errorf("cascade to CPU tier = %v, want %v", got, tc.to1)
			}
			if got := len(f.t2.stores) == 1; got != tc.to2 {
				t.Errorf("cascade to STORAGE tier = %v, want %v", got, tc.to2)
			}
			// Pins: one per cascade, no more.
			want := int32(0)
			for _, ok := range []bool{tc.to1, tc.to2} {
				if ok {
					want++
				}
			}
			if r := f.ref(K(0)); r != want {
				t.Errorf("ref = %d, want %d", r, want)
			}
			st := f.m.Stats()
			skipped := st.Tiers[0].CascadesSkippedByFilter + st.Tiers[1].CascadesSkippedByFilter
			if wantSkipped := 2 - uint64(want); skipped != wantSkipped {
				t.Errorf("skipped by filter %d, want %d", skipped, wantSkipped)
			}
		})
	}
}

func TestStoreFilterGatesEarlyCascade(t *testing.T) {
	f := storeFixture(t)
	f.m.OnNewRequest(f.ctx)
	f.store(f.ctx, keyRange(0, 2))
	f.step()
	f.step()
	f.t1.stores, f.t2.stores = nil, nil
	f.t1.policy = offload.RequestLevel
	f.t2.policy = offload.RequestLevel

	// Tier 1 (CPU) is excluded: only tier 2 counts as request-level.
	req := reqWith("rl", nil, offload.NewTierFilter(offload.TierMatcher{Medium: offload.MediumStorage}))
	if p := f.m.OnNewRequest(req); p != offload.RequestLevel {
		t.Fatalf("policy %v", p)
	}
	if _, _, err := f.m.PrepareStore(keyRange(0, 3), req); err != nil {
		t.Fatal(err)
	}
	if len(f.t1.stores) != 0 || len(f.t2.stores) != 1 {
		t.Fatalf("early cascade: tier1 %d, tier2 %d", len(f.t1.stores), len(f.t2.stores))
	}
	// A store filter that excludes every request-level tier: block level.
	none := reqWith("none", nil, offload.NewTierFilter())
	if p := f.m.OnNewRequest(none); p != offload.BlockLevel {
		t.Fatalf("policy %v with no storable request-level tier", p)
	}
}

func TestLoadFilterNeverCallsExcludedTier(t *testing.T) {
	f := storeFixture(t)
	f.t1.panics["Lookup"] = true // would be counted if called
	f.t2.blocks[K(0)] = true
	req := reqWith("r", offload.NewTierFilter(offload.TierMatcher{Medium: offload.MediumStorage, Locality: offload.LocalityLocal}), nil)
	if got := f.m.Lookup(K(0), req); got != offload.Retry {
		t.Fatalf("lookup = %v", got)
	}
	if len(f.t1.lookups) != 0 || f.m.Stats().Tiers[0].Panics != 0 {
		t.Fatal("excluded tier was called")
	}
	f.step()
	if len(f.t2.loads) != 1 {
		t.Fatal("promotion not submitted to the allowed tier")
	}
}

func TestLookupOrderAndRetry(t *testing.T) {
	f := newFixture(t)
	f.t1.retry = true
	f.t2.blocks[K(0)] = true
	// Tier 1 is unsure, tier 2 has it: tier 2 wins.
	if got := f.m.Lookup(K(0), f.ctx); got != offload.Retry {
		t.Fatalf("lookup = %v", got)
	}
	f.step()
	if len(f.t1.loads) != 0 || len(f.t2.loads) != 1 {
		t.Fatalf("loads: %d, %d", len(f.t1.loads), len(f.t2.loads))
	}
	// Only unsure answers: Retry. Nobody has it: Miss.
	if got := f.m.Lookup(K(1), f.ctx); got != offload.Retry {
		t.Errorf("unsure lookup = %v", got)
	}
	f.t1.retry = false
	if got := f.m.Lookup(K(1), f.ctx); got != offload.Miss {
		t.Errorf("absent lookup = %v", got)
	}
	// The first tier in order wins when both hold the key.
	f.t1.blocks[K(2)], f.t2.blocks[K(2)] = true, true
	f.m.Lookup(K(2), f.ctx)
	f.step()
	if len(f.t1.loads) != 1 {
		t.Error("tier 1 did not win")
	}
	st := f.m.Stats().Tiers
	if st[0].Retries != 2 || st[0].Misses != 1 || st[1].Hits != 1 {
		t.Errorf("stats %+v %+v", st[0], st[1])
	}
}

func TestHitPendingOnPromotion(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.HitPendingOnPromotion = true })
	f.t1.blocks[K(0)] = true
	if got := f.m.Lookup(K(0), f.ctx); got != offload.HitPending {
		t.Fatalf("lookup = %v, want HIT_PENDING", got)
	}
}

func TestPrimaryFullPromotionMisses(t *testing.T) {
	f := newFixture(t)
	f.m.OnNewRequest(f.ctx)
	if _, ok, _ := f.m.PrepareStore(keyRange(0, 5), f.ctx); !ok { // 5 pending slots
		t.Fatal("prepare store")
	}
	f.t1.blocks[K(9)] = true
	if got := f.m.Lookup(K(9), f.ctx); got != offload.Miss {
		t.Fatalf("lookup with full primary = %v, want MISS", got)
	}
	if st := f.m.Stats().Tiers[0]; st.PromotionsRejected != 1 || st.PromotionsStarted != 0 {
		t.Errorf("stats %+v", st)
	}
}

func TestLookupPrefixScan(t *testing.T) {
	f := newFixture(t)
	f.m.OnNewRequest(f.ctx)
	f.store(f.ctx, keyRange(0, 2))
	out, _, _ := f.m.PrepareStore(keyRange(2, 3), f.ctx) // K2 pending
	_ = out
	f.t1.blocks[K(3)] = true // K3 promotable: Retry
	f.t1.blocks[K(5)] = true // after K4's Miss: not scanned
	res := make([]offload.LookupResult, 7)
	for i := range res {
		res[i] = offload.Hit // must be overwritten
	}
	n := f.m.LookupPrefix(keyRange(0, 7), f.ctx, res)
	if n != 3 {
		t.Errorf("hits = %d, want 3 (Hit, Hit, HitPending)", n)
	}
	want := rs(offload.Hit, offload.Hit, offload.HitPending, offload.Retry, offload.Miss, offload.Miss, offload.Miss)
	if diff := cmp.Diff(want, res); diff != "" {
		t.Error(diff)
	}
	for _, c := range f.t1.lookups {
		if c.key == K(5) {
			t.Error("scan went past the first miss")
		}
	}
	// A Retry stops the count but not the scan: K0 Retry, K1 Hit.
	f2 := newFixture(t)
	f2.m.OnNewRequest(f2.ctx)
	f2.store(f2.ctx, keyRange(1, 2))
	f2.t1.blocks[K(0)] = true
	if n := f2.m.LookupPrefix(keyRange(0, 2), f2.ctx, res[:2]); n != 0 || res[1] != offload.Hit {
		t.Errorf("hits %d, results %v", n, res[:2])
	}
}

// A promotion started late in a scan may evict a block that hit earlier in
// it; that key must not be reported as a hit.
func TestLookupPrefixEvictionWithinScan(t *testing.T) {
	f := newFixture(t)
	f.m.OnNewRequest(f.ctx)
	f.store(f.ctx, keyRange(0, 5))
	f.step()
	f.step() // cascades done: all five evictable, K0 the oldest
	f.t1.blocks[K(5)] = true
	out := make([]offload.LookupResult, 6)
	n := f.m.LookupPrefix(keyRange(0, 6), f.ctx, out)
	want := rs(offload.Retry, offload.Hit, offload.Hit, offload.Hit, offload.Hit, offload.Retry)
	if diff := cmp.Diff(want, out); diff != "" || n != 0 {
		t.Errorf("hits %d; results (-want +got):\n%s", n, diff)
	}
	if f.p.Lookup(K(0)) != offload.Miss {
		t.Fatal("test premise: K0 should have been evicted")
	}
	// Without out, the count alone is corrected.
	f.step()
	f.step()
	f.t1.blocks[K(6)] = true
	if n := f.m.LookupPrefix(append(keyRange(1, 5), K(6)), f.ctx, nil); n != 0 {
		t.Errorf("hits without out = %d, want 0 (K1 evicted by K6's promotion)", n)
	}
}

func TestFailedPromotionFreesSlot(t *testing.T) {
	f := newFixture(t)
	f.t1.blocks[K(0)] = true
	f.m.Lookup(K(0), f.ctx)
	delete(f.t1.blocks, K(0)) // gone before the load runs
	f.step()
	f.step()
	if got := f.p.Lookup(K(0)); got != offload.Miss {
		t.Fatalf("primary after failed promotion: %v", got)
	}
	if st := f.m.Stats(); st.Tiers[0].PromotionsFailed != 1 || st.Primary.Pending != 0 {
		t.Errorf("stats %+v", st)
	}
}

func TestPartialPromotion(t *testing.T) {
	f := newFixture(t)
	for _, k := range keyRange(0, 4) {
		f.t1.blocks[k] = true
	}
	f.t1.partial = 2
	f.lookups(f.ctx, keyRange(0, 4))
	f.step()
	f.step()
	want := rs(offload.Hit, offload.Hit, offload.Miss, offload.Miss)
	var got []offload.LookupResult
	for _, k := range keyRange(0, 4) {
		got = append(got, f.p.Lookup(k))
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Error(diff)
	}
	st := f.m.Stats()
	if st.Tiers[0].PromotedBlocks != 2 || st.Tiers[0].PromotionBlocksFailed != 2 || st.Primary.Pending != 0 {
		t.Errorf("stats %+v", st.Tiers[0])
	}
}

func TestBogusSuccessfulKeys(t *testing.T) {
	f := newFixture(t)
	f.t1.hold = true
	for _, k := range keyRange(0, 3) {
		f.t1.blocks[k] = true
	}
	f.lookups(f.ctx, keyRange(0, 3))
	f.step()
	j := f.t1.held[0]
	f.t1.held = nil
	// Claims K0 and a key it was never asked for.
	f.t1.results = []offload.JobResult{{JobID: j.ID, SuccessfulKeys: []offload.Key{K(0), K(7), K(2)}}}
	f.step()
	if f.p.Lookup(K(0)) != offload.Hit || f.p.Lookup(K(1)) != offload.Miss || f.p.Lookup(K(2)) != offload.Miss || f.p.Lookup(K(7)) != offload.Miss {
		t.Error("only the true prefix may be committed")
	}
}

func TestFailedCascadeUnpins(t *testing.T) {
	f := newFixture(t)
	f.t1.failStores = true
	f.m.OnNewRequest(f.ctx)
	f.store(f.ctx, keyRange(0, 2))
	f.step()
	f.step()
	if r := f.ref(K(0)); r != 0 {
		t.Fatalf("ref %d after failed cascade", r)
	}
	st := f.m.Stats().Tiers
	if st[0].CascadesFailed != 1 || st[1].CascadesOK != 1 {
		t.Errorf("stats %+v / %+v", st[0], st[1])
	}
}

func TestUnknownAndStaleResults(t *testing.T) {
	var buf syncBuffer
	f := newFixture(t, func(c *Config) { c.Logger = slog.New(slog.NewTextHandler(&buf, nil)) })
	f.t1.extra = []offload.JobResult{{JobID: 12345, Success: true}}
	f.step()
	if st := f.m.Stats().Tiers[0]; st.UnknownJobs != 1 {
		t.Fatalf("unknown jobs %d", st.UnknownJobs)
	}
	if !strings.Contains(buf.String(), "not given") {
		t.Errorf("not logged: %s", buf.String())
	}
	// A result repeated is unknown the second time.
	f.t1.hold = true
	f.m.OnNewRequest(f.ctx)
	f.store(f.ctx, keyRange(0, 1))
	j := f.t1.held[0]
	f.t1.release()
	f.t1.extra = []offload.JobResult{{JobID: j.ID, Success: true}}
	f.step()
	f.step()
	if st := f.m.Stats().Tiers[0]; st.UnknownJobs != 2 || st.CascadesOK != 1 {
		t.Fatalf("stats %+v", st)
	}
	if r := f.ref(K(0)); r != 0 {
		t.Fatalf("duplicate result unpinned twice or never: ref %d", r)
	}
	// A job of tier 2 reported by tier 1 is unknown to tier 1.
	f.t2.hold = true
	f.store(f.ctx, keyRange(1, 2))
	f.t1.extra = []offload.JobResult{{JobID: f.t2.held[0].ID, Success: true}}
	f.step()
	f.step()
	if st := f.m.Stats().Tiers[0]; st.UnknownJobs != 3 {
		t.Fatalf("cross-tier result accepted: %+v", st)
	}
	if r := f.ref(K(1)); r != 2 { // both tiers hold their cascade
		t.Fatalf("tier 2's pin released by tier 1's report: ref %d", r)
	}
	// After a reset, results for older jobs are stale, not unknown.
	oldID := f.t2.held[0].ID
	f.t2.held = nil // the tier "forgets" to answer; reset must not hang
	if err := f.m.Reset(context.Background()); err != nil {
		t.Fatal(err)
	}
	f.t2.extra = []offload.JobResult{{JobID: oldID, Success: true}}
	f.step()
	if st := f.m.Stats(); st.StaleResults != 1 || st.Tiers[1].UnknownJobs != 0 {
		t.Fatalf("stats %+v", st)
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestTierPanics(t *testing.T) {
	for _, call := range []string{"Lookup", "SubmitStore", "SubmitLoad", "FinishedJobs", "Touch", "OnNewRequest",
		"OnRequestFinished", "OnScheduleEnd", "TakeEvents", "HasPendingWork"} {
		t.Run(call, func(t *testing.T) {
			f := newFixture(t)
			f.t1.panics[call] = true
			f.t2.blocks[K(9)] = true
			f.t1.blocks[K(8)] = true
			f.m.OnNewRequest(f.ctx)
			f.store(f.ctx, keyRange(0, 2))
			f.m.Touch(keyRange(0, 2), f.ctx)
			f.lookups(f.ctx, []offload.Key{K(8), K(9)})
			f.m.TakeEvents()
			for range 3 {
				f.step()
			}
			f.m.HasPendingWork() // asks the tiers only when the manager is idle
			f.m.OnRequestFinished(f.ctx)
			if call == "FinishedJobs" {
				// Its jobs stay outstanding until the tier answers.
				delete(f.t1.panics, call)
				f.step()
				f.step()
			}
			if f.m.Stats().Tiers[0].Panics == 0 {
				t.Fatal("panic not counted")
			}
			for _, k := range keyRange(0, 2) {
				if r := f.ref(k); r != 0 {
					t.Errorf("ref(%v) = %d: pin leaked", k, r)
				}
			}
			st := f.m.Stats()
			if st.Primary.Pending != 0 || st.JobsInFlight != 0 || st.Requests != 0 {
				t.Errorf("left behind: %+v", st)
			}
			if call == "Lookup" && f.p.Lookup(K(9)) != offload.Hit {
				t.Error("a panicking tier must not stop the next tier's promotion")
			}
		})
	}
}

func TestDrainPanicAbortsReset(t *testing.T) {
	f := newFixture(t)
	f.m.OnNewRequest(f.ctx)
	f.store(f.ctx, keyRange(0, 1))
	f.t2.panics["DrainJobs"] = true
	err := f.m.Reset(context.Background())
	if err == nil || !strings.Contains(err.Error(), `"2"`) {
		t.Fatalf("reset error %v", err)
	}
	if f.p.Lookup(K(0)) != offload.Hit {
		t.Error("primary reset although a tier could not be drained")
	}
}

func TestResetDrainTimeout(t *testing.T) {
	p := newPrimary(t, 4)
	slow, _ := memory.New(memory.Config{Name: "slow", Latency: time.Hour})
	m, err := New(Config{Primary: p, Tiers: []offload.SecondaryTier{slow}})
	if err != nil {
		t.Fatal(err)
	}
	req := reqWith("r", nil, nil)
	m.OnNewRequest(req)
	out, _, _ := m.PrepareStore(keyRange(0, 1), req)
	m.CompleteStore(out.KeysToStore, req, true)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if err := m.Reset(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("reset = %v", err)
	}
	// Close fails the slow job, unpins and closes cleanly.
	if err := m.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st := m.Stats(); st.Tiers[0].CascadesFailed != 1 || st.JobsInFlight != 0 {
		t.Errorf("stats %+v", st)
	}
}

func TestCloseAnswersEverything(t *testing.T) {
	f := newFixture(t)
	f.t1.hold, f.t2.hold = true, true
	f.m.OnNewRequest(f.ctx)
	f.store(f.ctx, keyRange(0, 2))
	f.t1.blocks[K(5)] = true
	f.m.Lookup(K(5), f.ctx) // pending promotion, never submitted
	if err := f.m.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	f.closed = true
	if st := f.m.Stats(); st.JobsInFlight != 0 || st.PendingPromotions != 0 || st.Tiers[0].CascadesOK != 1 {
		t.Errorf("after close %+v", st)
	}
	if err := f.m.Close(context.Background()); err != nil {
		t.Errorf("second close: %v", err)
	}
	if _, _, err := f.m.PrepareStore(keyRange(0, 1), f.ctx); !errors.Is(err, ErrClosed) {
		t.Errorf("prepare store after close: %v", err)
	}
	if got := f.m.Lookup(K(0), f.ctx); got != offload.Miss {
		t.Errorf("lookup after close: %v", got)
	}
}

func TestCloseTierPanicLeavesPrimaryOpen(t *testing.T) {
	f := newFixture(t)
	f.t1.panics["Close"] = true
	err := f.m.Close(context.Background())
	f.closed = true
	if err == nil || !strings.Contains(err.Error(), "primary left open") {
		t.Fatalf("close = %v", err)
	}
	if _, err := f.p.Arena().Slot(0); err != nil {
		t.Errorf("primary closed: %v", err)
	}
	f.p.Close()
}

func TestRequestErrors(t *testing.T) {
	f := newFixture(t)
	unknown := reqWith("nobody", nil, nil)
	if _, _, err := f.m.PrepareStore(keyRange(0, 1), unknown); !errors.Is(err, ErrUnknownRequest) {
		t.Errorf("prepare store of unknown request: %v", err)
	}
	f.m.OnNewRequest(f.ctx)
	out, _, _ := f.m.PrepareStore(keyRange(0, 1), f.ctx)
	// A completion under an unknown request still resolves the slot.
	if err := f.m.CompleteStore(out.KeysToStore, unknown, true); !errors.Is(err, ErrUnknownRequest) {
		t.Errorf("complete store of unknown request: %v", err)
	}
	if f.p.Lookup(K(0)) != offload.Hit || len(f.t1.stores) != 0 {
		t.Error("slot not resolved, or cascaded for an unknown request")
	}
	done := reqWith("done", nil, nil)
	f.m.OnNewRequest(done)
	f.m.OnRequestFinished(done)
	if _, _, err := f.m.PrepareStore(keyRange(1, 2), done); !errors.Is(err, ErrUnknownRequest) {
		t.Errorf("prepare store after finish: %v", err)
	}
	r := reqWith("pending", nil, nil)
	f.m.OnNewRequest(r)
	f.m.PrepareStore(keyRange(2, 3), r)
	f.m.OnRequestFinished(r)
	if _, _, err := f.m.PrepareStore(keyRange(3, 4), r); !errors.Is(err, ErrRequestFinished) {
		t.Errorf("prepare store of finished request: %v", err)
	}
	if _, err := f.m.PrepareLoad(keyRange(3, 4), r); err == nil {
		t.Error("prepare load of an absent key succeeded")
	}
	if err := f.m.CompleteLoad(keyRange(0, 1), r); err == nil {
		t.Error("complete load of an unpinned key succeeded")
	}
}

func TestNewValidates(t *testing.T) {
	p := newPrimary(t, 2)
	defer p.Close()
	a := newFake("a", 0, 0, nil)
	for _, cfg := range []Config{
		{},
		{Primary: p, Tiers: []offload.SecondaryTier{a, newFake("a", 0, 0, nil)}},
		{Primary: p, Tiers: []offload.SecondaryTier{nil}},
		{Primary: p, Admission: AdmissionConfig{Alpha: 2}},
		{Primary: p, Admission: AdmissionConfig{High: time.Second, Low: 2 * time.Second}},
	} {
		if _, err := New(cfg); err == nil {
			t.Errorf("New(%+v) succeeded", cfg)
		}
	}
}

func TestBackPressure(t *testing.T) {
	var buf syncBuffer
	f := newFixture(t, func(c *Config) {
		c.Logger = slog.New(slog.NewTextHandler(&buf, nil))
		c.Admission = AdmissionConfig{Warmup: 2}
	})
	f.m.OnNewRequest(f.ctx)
	f.t1.hold = true
	next := 0
	storeOne := func() {
		t.Helper()
		f.step()
		out, ok, err := f.m.PrepareStore([]offload.Key{K(next)}, f.ctx)
		if err != nil || !ok {
			t.Fatal(ok, err)
		}
		next++
		if err := f.m.CompleteStore(out.KeysToStore, f.ctx, true); err != nil {
			t.Fatal(err)
		}
	}
	// Warm-up samples are ignored however slow.
	f.t1.dur = 10 * time.Second
	for range 2 {
		storeOne()
		f.t1.release()
		f.step()
	}
	if f.m.Stats().Tiers[0].UnderPressure {
		t.Fatal("pressure during warm-up")
	}
	// One slow sample activates it.
	storeOne()
	f.t1.release()
	f.step()
	f.step()
	if !f.m.Stats().Tiers[0].UnderPressure {
		t.Fatal("no pressure after a 10 s cascade")
	}
	if !strings.Contains(buf.String(), "back-pressure activated") {
		t.Error("activation not logged")
	}
	// A probe goes through while nothing is in flight; the next cascades
	// are dropped while it is.
	storeOne()
	storeOne()
	storeOne()
	st := f.m.Stats().Tiers
	if len(f.t1.held) != 1 || st[0].CascadesDropped != 2 || st[0].CascadeBlocksDropped != 2 {
		t.Fatalf("held %d, stats %+v", len(f.t1.held), st[0])
	}
	if len(f.t2.stores) != 6 {
		t.Errorf("tier 2 (no pressure) got %d cascades, want 6", len(f.t2.stores))
	}
	// Dropped cascades pinned nothing.
	if r := f.ref(K(4)); r != 0 && f.t2.hold {
		t.Errorf("dropped cascade pinned: %d", r)
	}
	// Promotions are always admitted.
	f.t1.blocks[K(50)] = true
	if got := f.m.Lookup(K(50), f.ctx); got != offload.Retry {
		t.Errorf("promotion from a pressured tier: %v", got)
	}
	// Fast samples clear it: EMA 10 s → below 0.5 s takes a few.
	f.t1.dur = time.Millisecond
	for i := 0; i < 20 && f.m.Stats().Tiers[0].UnderPressure; i++ {
		f.t1.release()
		f.step()
		f.step()
		storeOne()
	}
	if f.m.Stats().Tiers[0].UnderPressure {
		t.Fatal("pressure never cleared")
	}
	if !strings.Contains(buf.String(), "back-pressure cleared") {
		t.Error("clear not logged")
	}
}

func TestBackPressureDisabled(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.Admission = AdmissionConfig{Disabled: true, Warmup: -1} })
	f.m.OnNewRequest(f.ctx)
	f.t1.dur = time.Minute
	for i := range 5 {
		f.store(f.ctx, keyRange(i, i+1))
		f.step()
		f.step()
	}
	if st := f.m.Stats().Tiers[0]; st.UnderPressure || st.CascadesDropped != 0 || st.CascadesOK != 5 {
		t.Errorf("stats %+v", st)
	}
}

func TestPressureDetector(t *testing.T) {
	c, err := AdmissionConfig{Warmup: -1}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	var p pressure
	var changes []bool
	for _, d := range []time.Duration{900, 1200, 1100, 800, 600, 400, 300} {
		if p.sample(d*time.Millisecond, &c) {
			changes = append(changes, p.active)
		}
	}
	// EMA: 0.9, 0.99, 1.023 (on), 0.956, 0.849, 0.714, 0.590, … never < 0.5 yet.
	if diff := cmp.Diff([]bool{true}, changes); diff != "" {
		t.Errorf("transitions %s; ema %v", diff, p.ema)
	}
	for range 5 {
		p.sample(100*time.Millisecond, &c)
	}
	if p.active {
		t.Errorf("still active at ema %v", p.ema)
	}
}

// Bytes stored by the engine into primary slots come back unchanged after
// a round trip through a memory tier.
func TestDataIntegrityThroughMemoryTiers(t *testing.T) {
	p := newPrimary(t, 4)
	t1, _ := memory.New(memory.Config{Name: "a", Medium: offload.MediumCPU})
	t2, _ := memory.New(memory.Config{Name: "b", Medium: offload.MediumStorage, Latency: time.Millisecond})
	m, err := New(Config{Primary: p, Tiers: []offload.SecondaryTier{t1, t2}})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close(context.Background())
	req := reqWith("w", nil, nil)
	m.OnNewRequest(req)
	keys := keyRange(0, 4)
	out, _, _ := m.PrepareStore(keys, req)
	want := map[offload.Key][]byte{}
	for i, k := range out.KeysToStore {
		b, _ := p.Arena().Slot(out.Slots[i])
		for j := range b {
			b[j] = byte(i*31 + j)
		}
		want[k] = bytes.Clone(b)
	}
	m.CompleteStore(out.KeysToStore, req, true)
	for m.HasPendingWork() {
		m.ScheduleEnd(offload.ScheduleEnd{})
		time.Sleep(time.Millisecond)
	}
	m.OnRequestFinished(req)
	if err := m.Reset(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Load only from tier b: the slow STORAGE tier.
	r := reqWith("r", offload.NewTierFilter(offload.TierMatcher{Medium: offload.MediumStorage}), nil)
	m.OnNewRequest(r)
	res := make([]offload.LookupResult, len(keys))
	for range 1000 {
		m.LookupPrefix(keys, r, res)
		if !slices.ContainsFunc(res, func(x offload.LookupResult) bool { return x != offload.Hit }) {
			break
		}
		m.ScheduleEnd(offload.ScheduleEnd{})
		time.Sleep(time.Millisecond)
	}
	slots, err := m.PrepareLoad(keys, r)
	if err != nil {
		t.Fatal(err)
	}
	for i, k := range keys {
		got, _ := p.Arena().Slot(slots[i])
		if !bytes.Equal(got, want[k]) {
			t.Errorf("%v: bytes differ after the round trip", k)
		}
	}
	if err := m.CompleteLoad(keys, r); err != nil {
		t.Fatal(err)
	}
	st := m.Stats()
	if st.Tiers[0].PromotedBlocks != 0 || st.Tiers[1].PromotedBlocks != 4 || st.Tiers[1].BytesIn != 4*testSlotSize || st.Tiers[1].BytesOut != 4*testSlotSize {
		t.Errorf("stats %+v", st.Tiers)
	}
}

func TestJobIDsUnique(t *testing.T) {
	f := newFixture(t)
	f.m.OnNewRequest(f.ctx)
	seen := map[uint64]bool{}
	for i := range 3 {
		f.store(f.ctx, keyRange(i, i+1))
		f.t1.blocks[K(10+i)] = true
		f.m.Lookup(K(10+i), f.ctx)
		f.step()
		f.step()
	}
	for _, tier := range []*fakeTier{f.t1, f.t2} {
		for _, j := range append(append([]*offload.Job{}, tier.stores...), tier.loads...) {
			if seen[j.ID] {
				t.Fatalf("job id %d reused", j.ID)
			}
			seen[j.ID] = true
		}
	}
	if len(seen) != 9 {
		t.Fatalf("%d jobs", len(seen))
	}
}

// The hot path: lookups of keys in the primary do not allocate.
func TestLookupInPrimaryDoesNotAllocate(t *testing.T) {
	if testing.CoverMode() != "" {
		t.Skip("coverage instrumentation allocates")
	}
	f := newFixture(t)
	f.m.OnNewRequest(f.ctx)
	keys := keyRange(0, 5)
	f.store(f.ctx, keys)
	f.step()
	f.step()
	out := make([]offload.LookupResult, len(keys))
	req := reqWith("r", offload.NewTierFilter(offload.TierMatcher{Medium: offload.MediumStorage}), nil)
	if n := testing.AllocsPerRun(100, func() {
		if f.m.LookupPrefix(keys, req, out) != len(keys) || f.m.Lookup(keys[0], req) != offload.Hit {
			t.Fatal("not all hits")
		}
	}); n != 0 {
		t.Errorf("%v allocations per prefix lookup", n)
	}
}
