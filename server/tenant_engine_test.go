package server_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	kvtierv1 "github.com/kvtier/kvtier/api/kvtier/v1"
	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/server"
)

// TestEnginesAsTenants: engines of two tenants with one layout attach with
// their tenants' tokens and get a namespace each, with an arena of its
// own: what acme's engine stores is in acme's mapping only, beta's engine
// looking up the same key misses, and neither reaches the other's
// namespace, arena or the admin's.
func TestEnginesAsTenants(t *testing.T) {
	const admin = "admin-token-0123456789"
	tenants := []server.TenantConfig{
		{Name: "acme", Token: "acme-token-0123456789", Namespaces: []string{""}},
		{Name: "beta", Token: "beta-token-0123456789", Namespaces: []string{""}},
	}
	sock, _ := startEngineDaemonWith(t, server.Limits{}, nil, func(c *server.Config) {
		c.AuthToken, c.Tenants, c.MaxNamespaces = admin, tenants, 6
	})
	ctx := ctxT(t)
	dial := func(token string) *client.Client {
		c, err := client.Dial(sock, client.Options{Token: token})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	acme, beta, adm := dial(tenants[0].Token), dial(tenants[1].Token), dial(admin)
	attach := func(c *client.Client) *kvtierv1.EngineAttachResponse {
		t.Helper()
		att, err := c.API().EngineAttach(ctx, &kvtierv1.EngineAttachRequest{Layout: engineLayout()})
		if err != nil {
			t.Fatal(err)
		}
		return att
	}
	aa, ba, da := attach(acme), attach(beta), attach(adm)
	if aa.GetNamespace() == ba.GetNamespace() || aa.GetNamespace() == da.GetNamespace() || !strings.HasSuffix(aa.GetNamespace(), "~acme") {
		t.Fatalf("namespaces: acme %q, beta %q, admin %q", aa.GetNamespace(), ba.GetNamespace(), da.GetNamespace())
	}
	if aa.GetTicket() == "" {
		t.Fatal("a tenant's attach carries no arena ticket")
	}

	// Each stores the same engine key with its own bytes.
	k := offload.MakeKey([]byte("shared-prompt-block"), 0)
	packed, size := pack(k)
	store := func(c *client.Client, att *kvtierv1.EngineAttachResponse, fill byte) *client.Arena {
		t.Helper()
		ns := att.GetNamespace()
		arena, err := c.WithNamespace(ns).MapArena(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { arena.Close() })
		r, err := c.API().EngineStep(ctx, &kvtierv1.EngineStepRequest{Namespace: ns, Epoch: att.GetEpoch(),
			NewRequests: []*kvtierv1.EngineNewRequest{{RequestId: "a"}}, WantFreeSlots: 1})
		if err != nil || len(r.GetGrantedSlots()) != 1 {
			t.Fatalf("step: %v %v", r, err)
		}
		slot := r.GetGrantedSlots()[0]
		b, _ := arena.Slot(slot)
		copy(b, bytes.Repeat([]byte{fill}, len(b)))
		r, err = c.API().EngineStep(ctx, &kvtierv1.EngineStepRequest{Namespace: ns, Epoch: att.GetEpoch(),
			Stores:             []*kvtierv1.EngineStore{{RequestId: "a", PackedKeys: packed, KeySize: size, Slots: []int64{slot}, Success: true}},
			FinishedRequestIds: []string{"a"}})
		if err != nil || len(r.GetWarnings()) != 0 {
			t.Fatalf("store: %v %v", r, err)
		}
		// Events name the engine's own key, without the space's tag.
		if len(r.GetEvents()) != 1 || !bytes.Equal(r.GetEvents()[0].GetPackedKeys(), packed) {
			t.Fatalf("events %v, want the engine's key", r.GetEvents())
		}
		return arena
	}
	acmeArena := store(acme, aa, 'a')
	lookup := func(c *client.Client, att *kvtierv1.EngineAttachResponse, id string) byte {
		t.Helper()
		r, err := c.API().EngineStep(ctx, &kvtierv1.EngineStepRequest{Namespace: att.GetNamespace(), Epoch: att.GetEpoch(),
			NewRequests:        []*kvtierv1.EngineNewRequest{{RequestId: id}},
			Lookups:            []*kvtierv1.EngineKeys{{RequestId: id, PackedKeys: packed, KeySize: size}},
			FinishedRequestIds: []string{id}})
		if err != nil || len(r.GetLookups()) != 1 {
			t.Fatalf("lookup: %v %v", r, err)
		}
		return r.GetLookups()[0].GetFound()[0]
	}
	hit, miss := byte(kvtierv1.RegionFound_REGION_FOUND_HIT), byte(kvtierv1.RegionFound_REGION_FOUND_MISS)
	if f := lookup(acme, aa, "b"); f != hit {
		t.Fatalf("acme's own block: %d", f)
	}
	if f := lookup(beta, ba, "b"); f != miss {
		t.Fatalf("beta's engine found acme's block: %d", f)
	}
	betaArena := store(beta, ba, 'b')
	for i := range acmeArena.NumSlots() {
		if b, _ := acmeArena.Slot(int64(i)); bytes.IndexByte(b, 'b') >= 0 {
			t.Fatalf("acme's mapping holds beta's bytes (slot %d)", i)
		}
	}
	for i := range betaArena.NumSlots() {
		if b, _ := betaArena.Slot(int64(i)); bytes.IndexByte(b, 'a') >= 0 {
			t.Fatalf("beta's mapping holds acme's bytes (slot %d)", i)
		}
	}

	// No tenant reaches another's engine namespace or the admin's.
	for _, tc := range []struct {
		c  *client.Client
		ns string
	}{{beta, aa.GetNamespace()}, {acme, da.GetNamespace()}, {acme, ""}} {
		if _, err := tc.c.WithNamespace(tc.ns).API().GetArena(ctx, &kvtierv1.GetArenaRequest{Namespace: tc.ns}); status.Code(err) != codes.PermissionDenied {
			t.Fatalf("GetArena of %q: %v", tc.ns, err)
		}
		_, err := tc.c.API().EngineStep(ctx, &kvtierv1.EngineStepRequest{Namespace: tc.ns, WantFreeSlots: 1})
		if status.Code(err) != codes.PermissionDenied {
			t.Fatalf("EngineStep on %q: %v", tc.ns, err)
		}
	}
	// A tenant creates at most its share of the engine namespaces:
	// (6 − 0 configured) / (2 tenants + 1) = 2.
	for i, want := range []codes.Code{codes.OK, codes.ResourceExhausted} {
		layout := strings.Replace(engineLayout(), `"model":"m"`, `"model":"m`+string(rune('1'+i))+`"`, 1)
		_, err := acme.API().EngineAttach(ctx, &kvtierv1.EngineAttachRequest{Layout: layout})
		if status.Code(err) != want {
			t.Fatalf("acme's layout %d: %v, want %v", i+2, err, want)
		}
	}
}

// BenchmarkEngineStepTenant is what a tenant's own engine namespace costs
// an engine step against the admin's (issue 42): the same step — a
// request, a lookup of 256 keys held in the primary (each HIT pins its
// block: the next step unpins them), the request finished — on the admin's
// namespace and on a tenant's, whose keys are put into its key space. One
// daemon, both over its Unix socket.
func BenchmarkEngineStepTenant(b *testing.B) {
	const admin = "admin-token-0123456789"
	tenants := []server.TenantConfig{{Name: "acme", Token: "acme-token-0123456789", Namespaces: []string{""}}}
	sock, _ := startEngineDaemonWith(b, server.Limits{}, nil, func(c *server.Config) {
		c.AuthToken, c.Tenants, c.MaxNamespaces = admin, tenants, 6
	})
	ctx := context.Background()
	for _, who := range []struct{ name, token string }{{"admin", admin}, {"tenant", tenants[0].Token}} {
		c, err := client.Dial(sock, client.Options{Token: who.token})
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		att, err := c.API().EngineAttach(ctx, &kvtierv1.EngineAttachRequest{Layout: engineLayout()})
		if err != nil {
			b.Fatal(err)
		}
		ns, epoch := att.GetNamespace(), att.GetEpoch()
		// 16 blocks in the 16-slot primary, looked up 16 times a step.
		r, err := c.API().EngineStep(ctx, &kvtierv1.EngineStepRequest{Namespace: ns, Epoch: epoch,
			NewRequests: []*kvtierv1.EngineNewRequest{{RequestId: "s"}}, WantFreeSlots: 16})
		if err != nil || len(r.GetGrantedSlots()) != 16 {
			b.Fatalf("lease: %v %v", r, err)
		}
		var ks []offload.Key
		for i := range 16 {
			ks = append(ks, offload.MakeKey([]byte(fmt.Sprintf("bench-block-%02d", i)), 0))
		}
		packed, size := pack(ks...)
		if _, err := c.API().EngineStep(ctx, &kvtierv1.EngineStepRequest{Namespace: ns, Epoch: epoch,
			Stores:             []*kvtierv1.EngineStore{{RequestId: "s", PackedKeys: packed, KeySize: size, Slots: r.GetGrantedSlots(), Success: true}},
			FinishedRequestIds: []string{"s"}}); err != nil {
			b.Fatal(err)
		}
		var lookups []byte
		for range 16 {
			lookups = append(lookups, packed...)
		}
		i := 0 // request ids stay unique over the runs of the sub-benchmark
		b.Run(who.name, func(b *testing.B) {
			for b.Loop() {
				// The step unpins what the previous one's lookups pinned
				// (its lookup leases), as an engine's loads do.
				prev, id := fmt.Sprint("r", i-1), fmt.Sprint("r", i)
				i++
				var unpins []*kvtierv1.EngineKeys
				if i > 1 {
					unpins = []*kvtierv1.EngineKeys{{RequestId: prev, PackedKeys: lookups, KeySize: size}}
				}
				r, err := c.API().EngineStep(ctx, &kvtierv1.EngineStepRequest{Namespace: ns, Epoch: epoch,
					NewRequests:        []*kvtierv1.EngineNewRequest{{RequestId: id}},
					Unpins:             unpins,
					Lookups:            []*kvtierv1.EngineKeys{{RequestId: id, PackedKeys: lookups, KeySize: size}},
					FinishedRequestIds: []string{id}})
				if err != nil || len(r.GetLookups()) != 1 || r.GetLookups()[0].GetFound()[0] != byte(kvtierv1.RegionFound_REGION_FOUND_HIT) {
					b.Fatalf("step %s: %v %v", id, r.GetWarnings(), err)
				}
			}
		})
	}
}

// BenchmarkEngineStoreLoadTenant is the arena-per-tenant store and load
// path against the admin's arena (issue 42): 16 blocks of 1 MiB leased,
// written into the mapping and stored, then looked up (each HIT pins its
// block), read back out of the mapping and unpinned — on the admin's
// engine namespace and on a tenant's, which has an arena of its own and
// keys in its key space. One daemon, both over its Unix socket.
func BenchmarkEngineStoreLoadTenant(b *testing.B) {
	const admin = "admin-token-0123456789"
	const blockBytes = 1 << 20
	tenants := []server.TenantConfig{{Name: "acme", Token: "acme-token-0123456789", Namespaces: []string{""}}}
	sock, _ := startEngineDaemonWith(b, server.Limits{}, nil, func(c *server.Config) {
		c.AuthToken, c.Tenants, c.MaxNamespaces = admin, tenants, 6
	})
	layout := strings.Replace(engineLayout(), `"row_stride":4096`, fmt.Sprintf(`"row_stride":%d`, blockBytes), 1)
	ctx := context.Background()
	src, dst := bytes.Repeat([]byte{7}, blockBytes), make([]byte, blockBytes)
	for _, who := range []struct{ name, token string }{{"admin", admin}, {"tenant", tenants[0].Token}} {
		c, err := client.Dial(sock, client.Options{Token: who.token})
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		att, err := c.API().EngineAttach(ctx, &kvtierv1.EngineAttachRequest{Layout: layout})
		if err != nil {
			b.Fatal(err)
		}
		ns, epoch := att.GetNamespace(), att.GetEpoch()
		arena, err := c.WithNamespace(ns).MapArena(ctx)
		if err != nil {
			b.Fatal(err)
		}
		defer arena.Close()
		step := func(req *kvtierv1.EngineStepRequest) *kvtierv1.EngineStepResponse {
			req.Namespace, req.Epoch = ns, epoch
			r, err := c.API().EngineStep(ctx, req)
			if err != nil || len(r.GetWarnings()) != 0 {
				b.Fatalf("step: %v %v", r.GetWarnings(), err)
			}
			return r
		}
		i := 0
		b.Run(who.name, func(b *testing.B) {
			b.SetBytes(2 * 16 * blockBytes)
			for b.Loop() {
				i++
				id := fmt.Sprint("r", i)
				var ks []offload.Key
				for j := range 16 {
					ks = append(ks, offload.MakeKey([]byte(fmt.Sprintf("block-%d-%02d", i, j)), 0))
				}
				packed, size := pack(ks...)
				r := step(&kvtierv1.EngineStepRequest{NewRequests: []*kvtierv1.EngineNewRequest{{RequestId: id}}, WantFreeSlots: 16})
				slots := r.GetGrantedSlots()
				if len(slots) != 16 {
					b.Fatalf("granted %d slots", len(slots))
				}
				for _, s := range slots {
					sb, _ := arena.Slot(s)
					copy(sb, src)
				}
				step(&kvtierv1.EngineStepRequest{Stores: []*kvtierv1.EngineStore{{RequestId: id, PackedKeys: packed, KeySize: size, Slots: slots, Success: true}}})
				r = step(&kvtierv1.EngineStepRequest{Lookups: []*kvtierv1.EngineKeys{{RequestId: id, PackedKeys: packed, KeySize: size}}})
				l := r.GetLookups()
				if len(l) != 1 || len(l[0].GetSlots()) != 16 {
					b.Fatalf("lookup answered %v", l)
				}
				for _, s := range l[0].GetSlots() {
					sb, _ := arena.Slot(s)
					copy(dst, sb)
				}
				step(&kvtierv1.EngineStepRequest{Unpins: []*kvtierv1.EngineKeys{{RequestId: id, PackedKeys: packed, KeySize: size}}, FinishedRequestIds: []string{id}})
			}
		})
	}
}
