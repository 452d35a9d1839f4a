package server_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	kvtierv1 "github.com/kvtier/kvtier/api/kvtier/v1"
	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/cpu"
	"github.com/kvtier/kvtier/filemapper"
	"github.com/kvtier/kvtier/keyspace"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/quota"
	"github.com/kvtier/kvtier/server"
	"github.com/kvtier/kvtier/tiers/fs"
	"github.com/kvtier/kvtier/tiers/peer"
	rt "github.com/kvtier/kvtier/tiers/remote/remotetest"
)

// tenantEnv is a daemon with tenants acme and beta on the default
// namespace, gamma on none of it, and the shared space "prompts" of acme
// and beta; its primary guarantees acme and beta 16 slots each.
func tenantEnv(t *testing.T, stream bool) *env {
	t.Helper()
	acme, _ := keyspace.Tenant("acme")
	beta, _ := keyspace.Tenant("beta")
	prompts, _ := keyspace.Shared("prompts")
	return startEnv(t, envOptions{
		slots:  64,
		token:  "admin-token",
		stream: stream,
		tenants: []server.TenantConfig{
			{Name: "acme", Token: "acme-token", Namespaces: []string{""}},
			{Name: "beta", Token: "beta-token", Namespaces: []string{""}},
			{Name: "gamma", Token: "gamma-token", Namespaces: []string{"elsewhere"}},
		},
		shared: []server.SharedSpaceConfig{{Name: "prompts", Tenants: []string{"acme", "beta"}}},
		shares: []cpu.Share{{Space: acme.ID(), Slots: 16}, {Space: beta.ID(), Slots: 16}, {Space: prompts.ID(), Slots: 8}},
	})
}

func (e *env) dialAs(t *testing.T, token, ns string) *client.Client {
	t.Helper()
	c, err := client.Dial(e.tcp, client.Options{Token: token, Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// tenantBlock is what a tenant writes under a key: its name and the key,
// so that a block read back says whose it is.
func tenantBlock(who string, k offload.Key) []byte {
	b := make([]byte, slotSize)
	copy(b, fmt.Sprintf("%s|%x|", who, string(k)))
	return b
}

func putAs(t *testing.T, c *client.Client, who string, ks ...offload.Key) {
	t.Helper()
	blocks := make([]client.Block, len(ks))
	for i, k := range ks {
		blocks[i] = client.Block{Key: k, Data: tenantBlock(who, k)}
	}
	if _, err := c.PutBlocks(ctxT(t), blocks, client.CallOptions{}); err != nil {
		t.Fatalf("%s put: %v", who, err)
	}
}

// get returns the bytes c reads for k, nil on a miss.
func get(t *testing.T, c *client.Client, k offload.Key) []byte {
	t.Helper()
	b, err := c.GetBlocks(ctxT(t), []offload.Key{k}, client.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return b.Data[0]
}

// TestTenantIsolation: two tenants storing one engine key each read their
// own bytes, on the API and on the block stream; a shared space is shared
// by its tenants only.
func TestTenantIsolation(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			e := tenantEnv(t, stream)
			acme := e.dialAs(t, "acme-token", "")
			beta := e.dialAs(t, "beta-token", "")
			k := key(1)
			putAs(t, acme, "acme", k)
			if got := get(t, beta, k); got != nil {
				t.Fatalf("beta read acme's block: %q", got[:16])
			}
			putAs(t, beta, "beta", k)
			if got := get(t, acme, k); !bytes.Equal(got, tenantBlock("acme", k)) {
				t.Fatalf("acme reads %q, want its own block", got[:16])
			}
			if got := get(t, beta, k); !bytes.Equal(got, tenantBlock("beta", k)) {
				t.Fatalf("beta reads %q, want its own block", got[:16])
			}
			// The shared space: acme writes, beta reads; neither private
			// space sees it, and gamma may not use it.
			sk := key(2)
			putAs(t, acme.WithNamespace("prompts"), "acme", sk)
			if got := get(t, beta.WithNamespace("prompts"), sk); !bytes.Equal(got, tenantBlock("acme", sk)) {
				t.Fatalf("beta reads %q from the shared space, want acme's block", got)
			}
			if got := get(t, beta, sk); got != nil {
				t.Fatal("a shared block is visible in beta's own space")
			}
			gamma := e.dialAs(t, "gamma-token", "prompts")
			_, err := gamma.GetBlocks(ctxT(t), []offload.Key{sk}, client.GetOptions{})
			wantCode(t, err, codes.PermissionDenied, "prompts")
		})
	}
}

// TestTenantHostile: a tenant's token against every call and namespace
// that is not its own is refused with PERMISSION_DENIED — for a namespace
// that does not exist as for one that does — and bad tokens are
// UNAUTHENTICATED.
func TestTenantHostile(t *testing.T) {
	e := tenantEnv(t, false)
	ctx := ctxT(t)
	acme := e.dialAs(t, "acme-token", "")
	api := acme.API()
	ks := [][]byte{[]byte(key(1))}
	for _, tc := range []struct {
		name string
		call func() error
	}{
		{"Reset", func() error { return acme.Reset(ctx) }},
		{"GetArena", func() error { _, err := api.GetArena(ctx, &kvtierv1.GetArenaRequest{}); return err }},
		{"ListBlocks", func() error { _, err := acme.ListBlocks(ctx, 0, 10); return err }},
		{"PrepareStore", func() error {
			_, err := api.PrepareStore(ctx, &kvtierv1.PrepareStoreRequest{RequestId: "r", Keys: ks})
			return err
		}},
		{"PrepareLoad", func() error {
			_, err := api.PrepareLoad(ctx, &kvtierv1.PrepareLoadRequest{RequestId: "r", Keys: ks})
			return err
		}},
		{"CompleteStore", func() error {
			_, err := api.CompleteStore(ctx, &kvtierv1.CompleteStoreRequest{RequestId: "r", Keys: ks, Success: true})
			return err
		}},
		{"EngineStep", func() error { _, err := api.EngineStep(ctx, &kvtierv1.EngineStepRequest{}); return err }},
		{"EngineReserve", func() error { _, err := api.EngineReserve(ctx, &kvtierv1.EngineReserveRequest{}); return err }},
		{"another namespace", func() error {
			_, err := acme.WithNamespace("elsewhere").GetBlocks(ctx, []offload.Key{key(1)}, client.GetOptions{})
			return err
		}},
		{"a namespace that does not exist", func() error {
			_, _, err := acme.WithNamespace("no-such-namespace").Lookup(ctx, "", []offload.Key{key(1)}, false)
			return err
		}},
		{"Stats of another namespace", func() error { _, err := acme.WithNamespace("elsewhere").Stats(ctx); return err }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			if status.Code(err) != codes.PermissionDenied {
				t.Fatalf("got %v, want PERMISSION_DENIED", err)
			}
		})
	}
	for _, tok := range []string{"", "wrong", "acme-token "} {
		c := e.dialAs(t, tok, "")
		_, err := c.GetBlocks(ctx, []offload.Key{key(1)}, client.GetOptions{})
		if status.Code(err) != codes.Unauthenticated {
			t.Errorf("token %q: got %v, want UNAUTHENTICATED", tok, err)
		}
	}
	// The admin may do all of it; its Reset leaves nothing of acme's.
	putAs(t, acme, "acme", key(7))
	admin := e.dialAs(t, "admin-token", "")
	if err := admin.Reset(ctx); err != nil {
		t.Fatal(err)
	}
	if got := get(t, acme, key(7)); got != nil {
		t.Fatal("acme's block survived the admin's Reset")
	}
	st, err := acme.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.GetTenants()) != 1 || st.GetTenants()[0].GetName() != "acme" || st.GetPrimary().GetNumSlots() != 0 || len(st.GetTiers()) != 0 {
		t.Fatalf("acme's Stats shows more than acme: %v", st)
	}
	if r := st.GetTenants()[0].GetRefusals(); r < 11 {
		t.Errorf("acme's refusals %d, want at least the 11 refused calls", r)
	}
}

// TestTenantRequestIDs: two tenants may use one request id; neither can
// finish the other's request.
func TestTenantRequestIDs(t *testing.T) {
	e := tenantEnv(t, false)
	ctx := ctxT(t)
	acme := e.dialAs(t, "acme-token", "")
	beta := e.dialAs(t, "beta-token", "")
	if _, err := acme.NewRequest(ctx, "req-1", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := beta.NewRequest(ctx, "req-1", ""); err != nil {
		t.Fatalf("beta's req-1 refused while acme's exists: %v", err)
	}
	if err := beta.FinishRequest(ctx, "req-1"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := acme.Lookup(ctx, "req-1", []offload.Key{key(1)}, false); err != nil {
		t.Fatalf("acme's request ended with beta's: %v", err)
	}
	if err := beta.FinishRequest(ctx, "req-1"); status.Code(err) != codes.NotFound {
		t.Fatalf("beta finished req-1 twice: %v", err)
	}
}

// TestTenantQuotaOverAPI: a tenant flooding puts does not evict another
// that stays within its quota, and Stats says so.
func TestTenantQuotaOverAPI(t *testing.T) {
	e := tenantEnv(t, false)
	ctx := ctxT(t)
	acme := e.dialAs(t, "acme-token", "")
	beta := e.dialAs(t, "beta-token", "")
	for i := range 16 {
		putAs(t, acme, "acme", key(i))
	}
	for i := range 500 {
		putAs(t, beta, "beta", key(1000+i))
	}
	for i := range 16 {
		if got := get(t, acme, key(i)); !bytes.Equal(got, tenantBlock("acme", key(i))) {
			t.Fatalf("acme lost block %d to beta's flood", i)
		}
	}
	st, err := e.dialAs(t, "admin-token", "").Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*kvtierv1.TenantStats{}
	for _, ts := range st.GetTenants() {
		byName[ts.GetName()] = ts
	}
	a, b := byName["acme"], byName["beta"]
	if a == nil || b == nil || byName["prompts"] == nil || !byName["prompts"].GetShared() {
		t.Fatalf("tenants in Stats: %v", st.GetTenants())
	}
	if a.GetPrimaryBytes() != 16*slotSize || a.GetEvictedByOthers() != 0 || a.GetPrimaryQuotaBytes() != 16*slotSize {
		t.Fatalf("acme: %v", a)
	}
	// beta holds its quota and everything no one else claims.
	if b.GetPrimaryBytes() != (64-16)*slotSize || b.GetStored() != 500 || b.GetEvicted() == 0 {
		t.Fatalf("beta: %v", b)
	}
	body := scrape(t, e)
	for _, want := range []string{
		fmt.Sprintf(`kvtier_tenant_primary_bytes{namespace="",tenant="acme"} %d`, 16*slotSize),
		fmt.Sprintf(`kvtier_tenant_primary_quota_bytes{namespace="",tenant="beta"} %d`, 16*slotSize),
		`kvtier_tenant_evictions_total{by="others",namespace="",tenant="acme"} 0`,
		`kvtier_tenant_stored_blocks_total{tenant="beta"} 500`,
		`kvtier_tenant_lookups_total{result="hit",tenant="acme"} 16`,
		`kvtier_tenant_primary_bytes{namespace="",tenant="prompts"} 0`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

// An fs tier divided between tenants reports each tenant's bytes in it.
func TestTenantTierMetrics(t *testing.T) {
	acme, _ := keyspace.Tenant("acme")
	e := startEnv(t, envOptions{
		slots: 64, token: "admin-token",
		tenants: []server.TenantConfig{{Name: "acme", Token: "acme-token", Namespaces: []string{""}}},
		tiers: func(envT) []offload.SecondaryTier {
			tier, err := fs.New(fs.Config{Name: "disk", RootDir: t.TempDir(), MaxBytes: 1 << 20,
				Shares:    []quota.Share{{Space: acme.ID(), Quota: 64 << 10}},
				Namespace: filemapper.Namespace{ModelName: "tenants", BlockBytes: slotSize}, Logger: quietLogger()})
			if err != nil {
				t.Fatal(err)
			}
			return []offload.SecondaryTier{tier}
		},
	})
	ctx := ctxT(t)
	acmeC := e.dialAs(t, "acme-token", "")
	putAs(t, acmeC, "acme", key(1), key(2))
	admin := e.dialAs(t, "admin-token", "")
	for pending := true; pending; {
		var err error
		if pending, err = admin.ScheduleEnd(ctx, nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	body := scrape(t, e)
	if !strings.Contains(body, `kvtier_tenant_tier_quota_bytes{namespace="",tenant="acme",tier="disk"} 65536`) ||
		strings.Contains(body, `kvtier_tenant_tier_bytes{namespace="",tenant="acme",tier="disk"} 0`) ||
		!strings.Contains(body, `kvtier_tenant_tier_bytes{namespace="",tenant="acme",tier="disk"}`) {
		t.Fatalf("metrics lack acme's bytes in the fs tier:\n%s", grepLines(body, "kvtier_tenant_tier"))
	}
}

// A peer's DRAM is divided by that daemon's own tenants: a block pushed
// under a tenant's key space counts against the same tenant's quota on
// the peer (key spaces are derived from the tenant's name, so two daemons
// that configure the tenant agree on its blocks), and another tenant's
// flood there never evicts it.
func TestPeerPushKeepsTenantQuotas(t *testing.T) {
	acme, _ := keyspace.Tenant("acme")
	b := startEnv(t, envOptions{slots: 16, token: "admin-token", stream: true, tiers: noTiers,
		tenants: []server.TenantConfig{
			{Name: "acme", Token: "acme-token", Namespaces: []string{""}},
			{Name: "beta", Token: "beta-token", Namespaces: []string{""}},
		},
		shares: []cpu.Share{{Space: acme.ID(), Slots: 8}},
	})
	tier, err := peer.New(peer.Config{Name: "fleet", Push: true, EventIndex: new(bool),
		Peers: []peer.PeerConfig{{Name: "b", Addr: b.tcp, Token: "admin-token"}}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer tier.Close(context.Background())
	// acme's blocks as acme's daemon cascades them: keys in acme's space.
	raw := keys(0, 8)
	tagged := make([]offload.Key, len(raw))
	arena := rt.NewArena(slotSize, len(raw))
	for i, k := range raw {
		tagged[i] = acme.Key([]byte(k))
		s, _ := arena.Slot(int64(i))
		copy(s, tenantBlock("acme", k))
	}
	req, _ := offload.NewReqContext("push", nil)
	if res := rt.Run(t, tier, &offload.Job{ID: 1, Keys: tagged, Slots: rt.Slots(0, len(raw)), Arena: arena, Req: req}); !res.Success {
		t.Fatalf("push: %v", res.Err)
	}
	// beta fills the peer's primary four times over.
	bc := b.dialAs(t, "beta-token", "")
	for j := range 8 {
		putAs(t, bc, "beta", keys(100+8*j, 8)...)
	}
	// Every pushed block is still there, acme's to read with its token.
	ac := b.dialAs(t, "acme-token", "")
	for _, k := range raw {
		if got := get(t, ac, k); !bytes.Equal(got, tenantBlock("acme", k)) {
			t.Fatalf("acme's pushed block %s is gone or changed on the peer after beta's flood", k)
		}
	}
	st, err := b.dial(t, b.unix).Stats(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, ts := range st.GetTenants() {
		if ts.GetName() == "acme" {
			found = true
			if ts.GetPrimaryBytes() != int64(8*slotSize) || ts.GetEvictedByOthers() != 0 {
				t.Errorf("the peer counts %d bytes for acme and %d evicted by others, want its 8 pushed blocks and none", ts.GetPrimaryBytes(), ts.GetEvictedByOthers())
			}
		}
	}
	if !found {
		t.Error("the peer's stats have no row for acme")
	}
}

// One tenant opening more connections took the whole request table
// (max_session_requests counts per connection): 4 connections of acme now
// hold at most max_tenant_requests together, and beta and the admin still
// start requests.
func TestTenantCannotTakeTheRequestTable(t *testing.T) {
	e := startEnv(t, envOptions{slots: 16, token: "admin-token", tiers: noTiers,
		limits: server.Limits{MaxRequests: 64, MaxSessionRequests: 16, MaxTenantRequests: 24},
		tenants: []server.TenantConfig{
			{Name: "acme", Token: "acme-token", Namespaces: []string{""}},
			{Name: "beta", Token: "beta-token", Namespaces: []string{""}},
		}})
	ctx := ctxT(t)
	held := 0
	var acme []*client.Client
	for conn := range 4 {
		c := e.dialAs(t, "acme-token", "")
		acme = append(acme, c)
		for i := range 16 {
			_, err := c.NewRequest(ctx, fmt.Sprintf("c%d-r%d", conn, i), "")
			switch {
			case err == nil:
				held++
			case status.Code(err) == codes.ResourceExhausted && strings.Contains(err.Error(), "max_tenant_requests"):
			default:
				t.Fatalf("acme's request %d on connection %d: %v", i, conn, err)
			}
		}
	}
	if held != 24 {
		t.Errorf("acme holds %d requests over 4 connections, want max_tenant_requests = 24", held)
	}
	for _, who := range []string{"beta-token", "admin-token"} {
		c := e.dialAs(t, who, "")
		for i := range 16 {
			if _, err := c.NewRequest(ctx, fmt.Sprint("r", i), ""); err != nil {
				t.Fatalf("%s's request %d after acme's flood: %v", who, i, err)
			}
		}
	}
	// A connection that ends gives its requests back to the tenant's share.
	c := e.dialAs(t, "acme-token", "")
	if _, err := c.NewRequest(ctx, "one-more", ""); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("acme past its share: %v", err)
	}
	acme[0].Close()
	rt.Eventually(t, 30*time.Second, "acme's first connection released its requests", func() bool {
		_, err := c.NewRequest(ctx, "one-more", "")
		return err == nil
	})
}
