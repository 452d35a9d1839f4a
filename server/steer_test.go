package server_test

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	kvtierv1 "github.com/kvtier/kvtier/api/kvtier/v1"
	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/tiering"
	"github.com/kvtier/kvtier/tiers/memory"
)

// blindTier hides the memory tier's Holds: a tier that cannot tell
// without I/O, as s3 and redis.
type blindTier struct{ offload.SecondaryTier }

// steerTiers are three memory tiers: a remote CPU one, a local storage
// one and a remote storage one that cannot answer residency queries.
func steerTiers(t envT) ([]*memory.Tier, func(envT) []offload.SecondaryTier) {
	var mts []*memory.Tier
	for _, c := range []memory.Config{
		{Name: "remote-cpu", Medium: offload.MediumCPU, Locality: offload.LocalityRemote},
		{Name: "local-disk", Medium: offload.MediumStorage, Locality: offload.LocalityLocal},
		{Name: "blind", Medium: offload.MediumStorage, Locality: offload.LocalityRemote},
	} {
		m, err := memory.New(c)
		if err != nil {
			t.Fatal(err)
		}
		mts = append(mts, m)
	}
	return mts, func(envT) []offload.SecondaryTier {
		return []offload.SecondaryTier{mts[0], mts[1], blindTier{mts[2]}}
	}
}

func TestResidency(t *testing.T) {
	mts, tiers := steerTiers(t)
	e := startEnv(t, envOptions{tiers: tiers})
	c := e.dial(t, e.unix)
	ctx := ctxT(t)
	ks := keys(0, 8)
	// The primary holds 2 keys, the tiers 4, 6 and 8 (each a prefix).
	var blocks []client.Block
	for _, k := range ks[:2] {
		blocks = append(blocks, client.Block{Key: k, Data: make([]byte, slotSize)})
	}
	if _, err := c.PutBlocks(ctx, blocks, client.CallOptions{Params: `{"kv_store_tiers":[]}`}); err != nil {
		t.Fatal(err)
	}
	for i, n := range []int{4, 6, 8} {
		for _, k := range ks[:n] {
			mts[i].Put(k, make([]byte, slotSize))
		}
	}
	before, err := c.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	type tierWant struct {
		allowed, known bool
		run            uint32
	}
	for _, tc := range []struct {
		params            string
		primary, loadable uint32
		tiers             []tierWant
	}{
		{"", 2, 6, []tierWant{{true, true, 4}, {true, true, 6}, {true, false, 0}}},
		{`{"kv_load_tiers":[{"medium":"cpu"}]}`, 2, 4, []tierWant{{true, true, 4}, {false, true, 0}, {false, false, 0}}},
		{`{"kv_load_tiers":[{"locality":"local"}]}`, 2, 6, []tierWant{{false, true, 0}, {true, true, 6}, {false, false, 0}}},
		{`{"kv_load_tiers":[]}`, 2, 2, []tierWant{{false, true, 0}, {false, true, 0}, {false, false, 0}}},
	} {
		r, err := c.Residency(ctx, ks, tc.params)
		if err != nil {
			t.Fatalf("%s: %v", tc.params, err)
		}
		if r.GetPrimary() != tc.primary || len(r.GetTiers()) != 3 {
			t.Fatalf("%s: primary %d, %d tiers", tc.params, r.GetPrimary(), len(r.GetTiers()))
		}
		if r.GetLoadable() != tc.loadable {
			t.Errorf("%s: loadable %d, want %d", tc.params, r.GetLoadable(), tc.loadable)
		}
		for i, w := range tc.tiers {
			got := r.GetTiers()[i]
			if got.GetAllowed() != w.allowed || got.GetKnown() != w.known || got.GetRun() != w.run {
				t.Errorf("%s: tier %s: %v, want %+v", tc.params, got.GetName(), got, w)
			}
		}
		if r.GetTiers()[1].GetMedium() != kvtierv1.Medium_MEDIUM_STORAGE || r.GetTiers()[0].GetLocality() != kvtierv1.Locality_LOCALITY_REMOTE {
			t.Errorf("declarations: %v", r.GetTiers())
		}
	}
	// Nothing was looked up, promoted or counted.
	after, err := c.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if a, b := after.GetPrimary(), before.GetPrimary(); a.GetLookups() != b.GetLookups() || a.GetUsedSlots() != 2 {
		t.Errorf("primary changed: %v -> %v", b, a)
	}
	for i, ts := range after.GetTiers() {
		if ts.GetHits()+ts.GetMisses()+ts.GetRetries()+ts.GetPromotionsOk() != 0 || ts.GetSkippedByFilter() != before.GetTiers()[i].GetSkippedByFilter() {
			t.Errorf("tier %s counted a residency query: %v", ts.GetName(), ts)
		}
	}
	// A key the daemon does not hold anywhere ends every run.
	r, err := c.Residency(ctx, append([]offload.Key{key(99)}, ks...), "")
	if err != nil || r.GetLoadable() != 0 || r.GetPrimary() != 0 {
		t.Errorf("a missing first key: %v %v", r, err)
	}
	// Bad input: a clear error, never a panic.
	// Lenient validation (the default): the filter a request would get,
	// and the warning; params that are not JSON are refused.
	if r, err := c.Residency(ctx, ks, `{"kv_load_tiers": 7}`); err != nil || len(r.GetWarnings()) != 1 || r.GetLoadable() != 6 {
		t.Errorf("bad filter: %v %v", r, err)
	}
	if _, err := c.Residency(ctx, ks, `{"kv_load_tiers": [`); status.Code(err) != codes.InvalidArgument {
		t.Errorf("params that are not JSON: %v", err)
	}
	if _, err := c.Residency(ctx, []offload.Key{"x"}, ""); status.Code(err) != codes.InvalidArgument {
		t.Errorf("bad key: %v", err)
	}
}

func TestPrefetch(t *testing.T) {
	mts, tiers := steerTiers(t)
	e := startEnv(t, envOptions{tiers: tiers})
	c := e.dial(t, e.unix)
	ctx := ctxT(t)
	ks := keys(0, 6)
	for _, k := range ks[:4] {
		mts[1].Put(k, make([]byte, slotSize)) // local-disk
	}
	// The filter allows no tier that holds them: nothing to do.
	a, err := c.Prefetch(ctx, ks, `{"kv_load_tiers":[{"medium":"cpu"}]}`, 0)
	if err != nil || a.GetStarted() != 0 || a.GetQueued() {
		t.Fatalf("filtered prefetch: %v %v", a, err)
	}
	a, err = c.Prefetch(ctx, ks, "", time.Minute)
	if err != nil || a.GetStarted() != 4 || a.GetPresent() != 0 || a.GetQueued() {
		t.Fatalf("prefetch: %v %v", a, err)
	}
	// The daemon lands the promotions by itself (auto_step): no engine
	// steps here.
	deadline := time.Now().Add(10 * time.Second)
	for {
		r, err := c.Residency(ctx, ks, "")
		if err != nil {
			t.Fatal(err)
		}
		if r.GetPrimary() == 4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the prefetched blocks never reached the primary: %v", r)
		}
		time.Sleep(5 * time.Millisecond)
	}
	// The engine's lookup answers HIT in the step that asks.
	if _, err := c.NewRequest(ctx, "r", ""); err != nil {
		t.Fatal(err)
	}
	res, hits, err := c.Lookup(ctx, "r", ks[:4], true)
	if err != nil || hits != 4 {
		t.Fatalf("engine lookup after the prefetch: %v hits %d %v", res, hits, err)
	}
	// Again: present, nothing started.
	if a, err = c.Prefetch(ctx, ks, "", 0); err != nil || a.GetPresent() != 4 || a.GetStarted() != 0 {
		t.Fatalf("second prefetch: %v %v", a, err)
	}
	waitMetric(t, e, "prefetch counters", nil, func(v float64) bool { return v == 4 }, "kvtier_prefetch_promotions_total")
	waitMetric(t, e, "prefetch counters", nil, func(v float64) bool { return v == 3 }, "kvtier_prefetches_total", "result", "completed")
}

func TestPrefetchRefusedWhenOff(t *testing.T) {
	// A tier-mode namespace has no primary; the daemon's own namespace
	// with prefetch off refuses with a reason.
	e := startEnv(t, envOptions{tiers: noTiers, prefetch: tiering.PrefetchConfig{Share: -1}})
	c := e.dial(t, e.unix)
	_, err := c.Prefetch(ctxT(t), keys(0, 2), "", 0)
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "prefetch is off") {
		t.Fatalf("prefetch off: %v", err)
	}
}

func TestPinUnpin(t *testing.T) {
	e := startEnv(t, envOptions{slots: 8, tiers: noTiers})
	c := e.dial(t, e.unix)
	ctx := ctxT(t)
	ks := keys(0, 3)
	var blocks []client.Block
	for _, k := range ks[:2] {
		blocks = append(blocks, client.Block{Key: k, Data: make([]byte, slotSize)})
	}
	if _, err := c.PutBlocks(ctx, blocks, client.CallOptions{}); err != nil {
		t.Fatal(err)
	}
	a, err := c.Pin(ctx, ks, time.Hour)
	if err != nil || a.GetPinned() != 2 || a.GetMissing() != 1 || a.GetRefused() != 0 {
		t.Fatalf("pin: %v %v", a, err)
	}
	st, err := c.Stats(ctx)
	if err != nil || st.GetRouterPinnedBlocks() != 2 || st.GetPrimary().GetPinnedSlots() != 2 {
		t.Fatalf("stats after pin: %v %v", st, err)
	}
	// A flood of stores cannot evict them.
	var flood []client.Block
	for _, k := range keys(100, 120) {
		flood = append(flood, client.Block{Key: k, Data: make([]byte, slotSize)})
	}
	_, _ = c.PutBlocks(ctx, flood, client.CallOptions{})
	if r, err := c.Residency(ctx, ks[:2], ""); err != nil || r.GetPrimary() != 2 {
		t.Fatalf("pinned blocks evicted: %v %v", r, err)
	}
	waitMetric(t, e, "pinned gauge", nil, func(v float64) bool { return v == 2 }, "kvtier_pinned_blocks")
	if n, err := c.Unpin(ctx, ks); err != nil || n != 2 {
		t.Fatalf("unpin: %d %v", n, err)
	}
	if st, _ := c.Stats(ctx); st.GetRouterPinnedBlocks() != 0 {
		t.Fatalf("pins left: %v", st)
	}
	for _, ttl := range []time.Duration{0, 25 * time.Hour} {
		if _, err := c.Pin(ctx, ks, ttl); status.Code(err) != codes.InvalidArgument {
			t.Errorf("TTL %v: %v", ttl, err)
		}
	}
}

func TestDelete(t *testing.T) {
	mts, tiers := steerTiers(t)
	e := startEnv(t, envOptions{tiers: tiers})
	c := e.dial(t, e.unix)
	ctx := ctxT(t)
	ks := keys(0, 3)
	var blocks []client.Block
	for _, k := range ks {
		blocks = append(blocks, client.Block{Key: k, Data: make([]byte, slotSize)})
		for _, m := range mts {
			m.Put(k, make([]byte, slotSize))
		}
	}
	if _, err := c.PutBlocks(ctx, blocks, client.CallOptions{Params: `{"kv_store_tiers":[]}`}); err != nil {
		t.Fatal(err)
	}
	a, err := c.Delete(ctx, ks)
	if err != nil || a.GetPrimary() != 3 || a.GetHeld() != 0 || len(a.GetTiers()) != 3 {
		t.Fatalf("delete: %v %v", a, err)
	}
	for i, want := range []struct {
		supported bool
		removed   uint32
	}{{true, 3}, {true, 3}, {false, 0}} {
		if got := a.GetTiers()[i]; got.GetSupported() != want.supported || got.GetRemoved() != want.removed {
			t.Errorf("tier %s: %v", got.GetName(), got)
		}
	}
	r, err := c.Residency(ctx, ks, "")
	if err != nil || r.GetPrimary() != 0 || r.GetLoadable() != 0 {
		t.Fatalf("residency after delete: %v %v", r, err)
	}
	if !mts[2].Contains(ks[0]) {
		t.Fatal("a tier that does not delete on request lost its block")
	}
	waitMetric(t, e, "deleted counter", nil, func(v float64) bool { return v == 3 }, "kvtier_deleted_blocks_total", "tier", "local-disk")
}

// TestSteerCallsStayInTheTenantsKeySpace: a tenant's residency, pins and
// deletes reach its own blocks only, and another namespace is refused.
func TestSteerCallsStayInTheTenantsKeySpace(t *testing.T) {
	e := tenantEnv(t, false)
	acme := e.dialAs(t, "acme-token", "")
	beta := e.dialAs(t, "beta-token", "")
	ctx := ctxT(t)
	k := key(7)
	putAs(t, acme, "acme", k)
	if r, err := acme.Residency(ctx, []offload.Key{k}, ""); err != nil || r.GetPrimary() != 1 {
		t.Fatalf("acme's residency of its block: %v %v", r, err)
	}
	if r, err := beta.Residency(ctx, []offload.Key{k}, ""); err != nil || r.GetPrimary() != 0 {
		t.Fatalf("beta sees acme's block: %v %v", r, err)
	}
	if a, err := beta.Pin(ctx, []offload.Key{k}, time.Hour); err != nil || a.GetPinned() != 0 || a.GetMissing() != 1 {
		t.Fatalf("beta pinned acme's block: %v %v", a, err)
	}
	if a, err := beta.Delete(ctx, []offload.Key{k}); err != nil || a.GetPrimary() != 0 {
		t.Fatalf("beta deleted acme's block: %v %v", a, err)
	}
	if got := get(t, acme, k); !bytes.Equal(got, tenantBlock("acme", k)) {
		t.Fatal("acme's block is gone after beta's calls")
	}
	if a, err := acme.Delete(ctx, []offload.Key{k}); err != nil || a.GetPrimary() != 1 {
		t.Fatalf("acme's delete of its block: %v %v", a, err)
	}
	gamma := e.dialAs(t, "gamma-token", "")
	_, err := gamma.Residency(ctx, []offload.Key{k}, "")
	wantCode(t, err, codes.PermissionDenied, "")
}

// Each tenant pins within its own budget (pins.share, 0.25, of its quota
// of 16 slots: 4 blocks): past it its pins are refused, whatever another
// tenant holds, and no tenant's stores evict another's pins.
func TestPinBudgetPerTenant(t *testing.T) {
	e := tenantEnv(t, false)
	ctx := ctxT(t)
	clients := map[string]*client.Client{"acme": e.dialAs(t, "acme-token", ""), "beta": e.dialAs(t, "beta-token", "")}
	ks := keys(0, 8)
	for who, c := range clients {
		putAs(t, c, who, ks...)
	}
	for who, c := range clients {
		a, err := c.Pin(ctx, ks, time.Hour)
		if err != nil || a.GetPinned() != 4 || a.GetRefused() != 4 {
			t.Fatalf("%s pins 8 blocks with a budget of 4: %v %v", who, a, err)
		}
	}
	// acme stores far past its quota (80 blocks into 64 slots): its own
	// pinned blocks stay although acme is the first to lose blocks, and
	// so do beta's.
	putAs(t, clients["acme"], "acme", keys(100, 40)...)
	putAs(t, clients["acme"], "acme", keys(200, 40)...)
	for who, c := range clients {
		r, err := c.Residency(ctx, ks[:4], "")
		if err != nil || r.GetPrimary() != 4 {
			t.Fatalf("%s's pinned blocks after acme's flood: %v %v", who, r, err)
		}
	}
	if r, _ := clients["acme"].Residency(ctx, ks[4:], ""); r.GetPrimary() != 0 {
		t.Fatalf("acme's unpinned blocks survived its own flood: %v (the flood did not press the primary)", r)
	}
	for _, k := range ks[:4] {
		if got := get(t, clients["beta"], k); !bytes.Equal(got, tenantBlock("beta", k)) {
			t.Fatalf("beta's pinned block %s changed", k)
		}
	}
}

// TestDeleteAllOfATenant: a tenant deletes every block of its key space —
// from the primary and from every tier that lists what it holds — and
// nothing of another tenant's or the daemon's own; the admin offboards a
// named tenant; no tenant deletes another's.
func TestDeleteAllOfATenant(t *testing.T) {
	e := tenantEnv(t, false)
	ctx := ctxT(t)
	admin := e.dial(t, e.tcp)
	acme, beta := e.dialAs(t, "acme-token", ""), e.dialAs(t, "beta-token", "")
	ks := keys(0, 8)
	putAs(t, acme, "acme", ks...)
	putAs(t, beta, "beta", ks...)
	own := key(100)
	if _, err := admin.PutBlocks(ctx, []client.Block{{Key: own, Data: tenantBlock("admin", own)}}, client.CallOptions{}); err != nil {
		t.Fatal(err)
	}
	for pending := true; pending; time.Sleep(time.Millisecond) { // every block in both tiers
		var err error
		if pending, err = admin.ScheduleEnd(ctx, nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	a, err := acme.DeleteAll(ctx, "")
	if err != nil || a.GetPrimary() != 8 || len(a.GetTiers()) != 2 {
		t.Fatalf("acme deletes its blocks: %v %v", a, err)
	}
	for _, tier := range a.GetTiers() {
		if !tier.GetSupported() || tier.GetRemoved() != 8 {
			t.Fatalf("acme's blocks in tier %s: %v", tier.GetName(), tier)
		}
	}
	hits := func(c *client.Client, ks ...offload.Key) int {
		t.Helper()
		got, err := c.GetBlocks(ctx, ks, client.GetOptions{Wait: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return got.Hits
	}
	if n := hits(acme, ks...); n != 0 {
		t.Fatalf("acme still reads %d of its deleted blocks", n)
	}
	if n := hits(beta, ks...); n != 8 {
		t.Fatalf("beta reads %d of its 8 blocks after acme's delete", n)
	}
	if n := hits(admin, own); n != 1 {
		t.Fatal("the daemon's own block went with acme's")
	}
	for _, tc := range []struct {
		c      *client.Client
		tenant string
		want   codes.Code
	}{
		{acme, "beta", codes.PermissionDenied},
		{admin, "", codes.InvalidArgument},
		{admin, "nobody", codes.NotFound},
	} {
		if _, err := tc.c.DeleteAll(ctx, tc.tenant); status.Code(err) != tc.want {
			t.Fatalf("delete all of %q: %v, want %v", tc.tenant, err, tc.want)
		}
	}
	if _, err := admin.API().Delete(ctx, &kvtierv1.DeleteRequest{All: true, Tenant: "beta", Keys: [][]byte{[]byte(own)}}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("all with keys: %v", err)
	}
	if a, err := admin.DeleteAll(ctx, "beta"); err != nil || a.GetPrimary() != 8 {
		t.Fatalf("the admin offboards beta: %v %v", a, err)
	}
	if n := hits(beta, ks...); n != 0 {
		t.Fatalf("beta still reads %d blocks after it was offboarded", n)
	}
	if n := hits(admin, own); n != 1 {
		t.Fatal("the daemon's own block went with beta's")
	}
}
