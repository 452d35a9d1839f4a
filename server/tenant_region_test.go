package server_test

import (
	"bytes"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	kvtierv1 "github.com/kvtier/kvtier/api/kvtier/v1"
	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/server"
)

// TestRegionsAsTenants: tier-mode engines of two tenants and the admin
// register regions of one layout. A region belongs to the first principal
// that drives it: acme's stores are found by acme only (key spaces), beta
// cannot drive acme's region, and each engine's step events name its own
// keys only, without the tag.
func TestRegionsAsTenants(t *testing.T) {
	const admin = "admin-token-0123456789"
	sock, _, _ := startRegionDaemonWith(t, server.Config{AuthToken: admin, Tenants: []server.TenantConfig{
		{Name: "acme", Token: "acme-token-0123456789", Namespaces: []string{""}},
		{Name: "beta", Token: "beta-token-0123456789", Namespaces: []string{""}},
	}})
	ctx := ctxT(t)
	type engine struct {
		c       *client.Client
		r       *client.Region
		results kvtierv1.KVTier_RegionResultsClient
	}
	start := func(token string) *engine {
		t.Helper()
		c, err := client.Dial(sock, client.Options{Token: token})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		f, _ := regionFile(t, 4*4096)
		r, err := c.RegisterRegion(ctx, layoutJSON{NumBlocks: 4, RowStride: 4096, BlocksPerChunk: 1, Model: "m", DType: "float16", WorldSize: 1}, f)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close(ctx) })
		results, err := r.Results(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return &engine{c, r, results}
	}
	acme, beta, adm := start("acme-token-0123456789"), start("beta-token-0123456789"), start(admin)
	if acme.r.Namespace != beta.r.Namespace {
		t.Fatalf("one layout, two namespaces: %q %q", acme.r.Namespace, beta.r.Namespace)
	}
	k := offload.MakeKey([]byte("tenant-region-block"), 0)
	if err := acme.r.Submit(ctx, []client.RegionJob{{ID: 1, RequestID: "a", Keys: []offload.Key{k}, Slots: []int64{1}}}); err != nil {
		t.Fatal(err)
	}
	if res, err := acme.results.Recv(); err != nil || !res.GetResults()[0].GetSuccess() {
		t.Fatalf("acme's store: %v %v", res, err)
	}
	ev, err := acme.r.Step(ctx, []string{"a"})
	if err != nil {
		t.Fatal(err)
	}
	if len(ev) != 1 || !bytes.Equal(ev[0].GetPackedKeys(), []byte(k)) {
		t.Fatalf("acme's step events %v, want its own key untagged", ev)
	}
	found := func(e *engine, id string) kvtierv1.RegionFound {
		t.Helper()
		f, err := e.r.Lookup(ctx, id, "", []offload.Key{k})
		if err != nil {
			t.Fatal(err)
		}
		return f[0]
	}
	if f := found(acme, "b"); f != kvtierv1.RegionFound_REGION_FOUND_HIT {
		t.Fatalf("acme's own block: %v", f)
	}
	for who, e := range map[string]*engine{"beta": beta, "the admin": adm} {
		if f := found(e, "b"); f != kvtierv1.RegionFound_REGION_FOUND_MISS {
			t.Fatalf("%s found acme's block: %v", who, f)
		}
		ev, err := e.r.Step(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(ev) != 0 {
			t.Fatalf("%s's engine got acme's events: %v", who, ev)
		}
	}
	// beta cannot drive acme's region; the admin may.
	if _, err := beta.c.API().RegionLookup(ctx, &kvtierv1.RegionLookupRequest{RegionId: acme.r.ID, RequestId: "x", PackedKeys: []byte(k), KeySize: uint32(len(k))}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("beta drove acme's region: %v", err)
	}
	r, err := adm.c.API().RegionLookup(ctx, &kvtierv1.RegionLookupRequest{RegionId: acme.r.ID, RequestId: "x", PackedKeys: []byte(k), KeySize: uint32(len(k))})
	if err != nil || r.GetFound()[0] != byte(kvtierv1.RegionFound_REGION_FOUND_HIT) {
		t.Fatalf("the admin looks up in acme's region (acme's key space): %v %v", r, err)
	}
	// Residency of the tier-mode namespace (issue 41), each principal in
	// its own key space: acme's block for acme, nothing for the others.
	for _, tc := range []struct {
		who  string
		e    *engine
		want uint32
	}{{"acme", acme, 1}, {"beta", beta, 0}, {"the admin", adm, 0}} {
		res, err := tc.e.c.WithNamespace(acme.r.Namespace).Residency(ctx, []offload.Key{k}, "")
		if err != nil || res.GetLoadable() != tc.want || len(res.GetTiers()) == 0 || !res.GetTiers()[0].GetKnown() {
			t.Fatalf("residency for %s: %v %v, want loadable %d", tc.who, res, err, tc.want)
		}
	}
}
