package server_test

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"pgregory.net/rapid"

	kvtierv1 "github.com/kvtier/kvtier/api/kvtier/v1"
	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/cpu"
	"github.com/kvtier/kvtier/keyspace"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/server"
)

// TestTenantsModel drives a daemon with random tenants, quotas and a
// shared space through its API — puts and gets by every tenant in every
// namespace, admin Resets, admin calls and bad tokens from tenants — and
// checks after every step:
//
//   - no read ever returns a block another key space stored: every block a
//     tenant reads is one that was put under that key in that space;
//   - a call outside a tenant's rights is PERMISSION_DENIED (a bad token
//     UNAUTHENTICATED), and one within them succeeds;
//   - a tenant holding no more than its quota loses no block to another
//     tenant's put, and one that does is left at its quota or above;
//   - a put into a tenant's own space that fits within its quota is never
//     refused and evicts none of its blocks, whatever the other tenants
//     do meanwhile: pin their blocks (the steering API), flood the request
//     table, hold requests open and kill their sessions.
func TestTenantsModel(t *testing.T) {
	rapid.Check(t, tenantsModel)
}

type modelTenant struct {
	name, token string
	quota       int // slots
	client      *client.Client
}

func tenantsModel(rt *rapid.T) {
	const slots = 24
	n := rapid.IntRange(2, 3).Draw(rt, "tenants")
	var tenants []*modelTenant
	var cfgs []server.TenantConfig
	var shares []cpu.Share
	left := slots
	for i := range n {
		tn := &modelTenant{name: fmt.Sprintf("t%d", i), token: fmt.Sprintf("token-%d", i)}
		tn.quota = rapid.IntRange(0, left/2).Draw(rt, "quota")
		left -= tn.quota
		tenants = append(tenants, tn)
		cfgs = append(cfgs, server.TenantConfig{Name: tn.name, Token: tn.token, Namespaces: []string{""}})
		sp, _ := keyspace.Tenant(tn.name)
		shares = append(shares, cpu.Share{Space: sp.ID(), Slots: tn.quota, Weight: float64(rapid.IntRange(1, 3).Draw(rt, "weight"))})
	}
	// The shared space: the first two tenants.
	sharedQuota := rapid.IntRange(0, left/2).Draw(rt, "shared quota")
	sp, _ := keyspace.Shared("common")
	shares = append(shares, cpu.Share{Space: sp.ID(), Slots: sharedQuota})
	e := startEnv(rt, envOptions{
		slots: slots, token: "admin", tiers: noTiers, tenants: cfgs, shares: shares, stream: rapid.Bool().Draw(rt, "stream"),
		shared: []server.SharedSpaceConfig{{Name: "common", Tenants: []string{"t0", "t1"}}},
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dial := func(token, ns string) *client.Client {
		c, err := client.Dial(e.tcp, client.Options{Token: token, Namespace: ns})
		if err != nil {
			rt.Fatal(err)
		}
		rt.Cleanup(func() { c.Close() })
		return c
	}
	for _, tn := range tenants {
		tn.client = dial(tn.token, "")
	}
	admin := dial("admin", "")
	// written[space][key]: the bytes put under key in space, every version.
	written := map[string]map[offload.Key][][]byte{}
	version := 0
	namespaces := []string{"", "common", "other"}
	allowed := func(tn *modelTenant, ns string) bool {
		return ns == "" || ns == "common" && (tn.name == "t0" || tn.name == "t1")
	}
	spaceOf := func(tn *modelTenant, ns string) string {
		if ns == "common" {
			return "common"
		}
		return tn.name
	}
	keyGen := rapid.IntRange(0, 30)
	tenantStats := func() map[string]*kvtierv1.TenantStats {
		st, err := admin.Stats(ctx)
		if err != nil {
			rt.Fatal(err)
		}
		m := map[string]*kvtierv1.TenantStats{}
		for _, ts := range st.GetTenants() {
			m[ts.GetName()] = ts
		}
		return m
	}
	quotaOf := map[string]int{"common": sharedQuota}
	for _, tn := range tenants {
		quotaOf[tn.name] = tn.quota
	}

	rt.Repeat(map[string]func(*rapid.T){
		"put": func(rt *rapid.T) {
			tn := rapid.SampledFrom(tenants).Draw(rt, "tenant")
			ns := rapid.SampledFrom(namespaces).Draw(rt, "namespace")
			nk := rapid.IntRange(1, 3).Draw(rt, "keys")
			var blocks []client.Block
			for range nk {
				k := key(keyGen.Draw(rt, "key"))
				if slices.ContainsFunc(blocks, func(b client.Block) bool { return b.Key == k }) {
					continue
				}
				version++
				data := make([]byte, slotSize)
				copy(data, fmt.Sprintf("%s|%s|%x|v%d|", spaceOf(tn, ns), tn.name, string(k), version))
				blocks = append(blocks, client.Block{Key: k, Data: data})
			}
			before := tenantStats()
			_, err := tn.client.WithNamespace(ns).PutBlocks(ctx, blocks, client.CallOptions{})
			if !allowed(tn, ns) {
				if status.Code(err) != codes.PermissionDenied {
					rt.Fatalf("%s put into %q: %v, want PERMISSION_DENIED", tn.name, ns, err)
				}
				return
			}
			if err != nil {
				if status.Code(err) == codes.ResourceExhausted {
					if held := before[tn.name].GetPrimaryBytes(); ns == "" && held+int64(len(blocks))*slotSize <= int64(tn.quota)*slotSize {
						rt.Fatalf("%s, holding %d of its %d quota bytes, was refused a put of %d blocks: %v", tn.name, held, tn.quota*slotSize, len(blocks), err)
					}
					return // no room it may take: refused, nothing written
				}
				rt.Fatalf("%s put into %q: %v", tn.name, ns, err)
			}
			space := spaceOf(tn, ns)
			if written[space] == nil {
				written[space] = map[offload.Key][][]byte{}
			}
			for _, b := range blocks {
				written[space][b.Key] = append(written[space][b.Key], b.Data)
			}
			after := tenantStats()
			if held := before[tn.name].GetPrimaryBytes(); ns == "" && held+int64(len(blocks))*slotSize <= int64(tn.quota)*slotSize &&
				after[tn.name].GetEvicted() != before[tn.name].GetEvicted() {
				rt.Fatalf("%s, holding %d of its %d quota bytes, evicted %d of its own blocks to store %d", tn.name, held, tn.quota*slotSize,
					after[tn.name].GetEvicted()-before[tn.name].GetEvicted(), len(blocks))
			}
			for name, a := range after {
				b := before[name]
				if name == space || a.GetEvictedByOthers() == b.GetEvictedByOthers() {
					continue
				}
				q := int64(quotaOf[name]) * slotSize
				if b.GetPrimaryBytes() <= q {
					rt.Fatalf("%s held %d bytes, within its quota %d, and lost blocks to a put into %s", name, b.GetPrimaryBytes(), q, space)
				}
				if a.GetPrimaryBytes() < q {
					rt.Fatalf("%s evicted below its quota (%d < %d bytes) by a put into %s", name, a.GetPrimaryBytes(), q, space)
				}
			}
		},
		"get": func(rt *rapid.T) {
			tn := rapid.SampledFrom(tenants).Draw(rt, "tenant")
			ns := rapid.SampledFrom(namespaces).Draw(rt, "namespace")
			k := key(keyGen.Draw(rt, "key"))
			got, err := tn.client.WithNamespace(ns).GetBlocks(ctx, []offload.Key{k}, client.GetOptions{})
			if !allowed(tn, ns) {
				if status.Code(err) != codes.PermissionDenied {
					rt.Fatalf("%s get from %q: %v, want PERMISSION_DENIED", tn.name, ns, err)
				}
				return
			}
			if err != nil {
				rt.Fatalf("%s get from %q: %v", tn.name, ns, err)
			}
			d := got.Data[0]
			if d == nil {
				return
			}
			space := spaceOf(tn, ns)
			for _, w := range written[space][k] {
				if bytes.Equal(w, d) {
					return
				}
			}
			rt.Fatalf("%s read %q under %v from %q: no put into space %s wrote it", tn.name, bytes.TrimRight(d, "\x00"), k, ns, space)
		},
		"admin call by a tenant": func(rt *rapid.T) {
			tn := rapid.SampledFrom(tenants).Draw(rt, "tenant")
			var err error
			switch rapid.IntRange(0, 3).Draw(rt, "call") {
			case 0:
				err = tn.client.Reset(ctx)
			case 1:
				_, err = tn.client.ListBlocks(ctx, 0, 100)
			case 2:
				_, err = tn.client.API().GetArena(ctx, &kvtierv1.GetArenaRequest{})
			case 3:
				_, err = tn.client.API().PrepareStore(ctx, &kvtierv1.PrepareStoreRequest{Keys: [][]byte{[]byte(key(1))}})
			}
			if status.Code(err) != codes.PermissionDenied {
				rt.Fatalf("%s made an admin call: %v", tn.name, err)
			}
		},
		"bad token": func(rt *rapid.T) {
			tok := rapid.SampledFrom([]string{"", "token-", "token-0x", strings.Repeat("a", 64)}).Draw(rt, "token")
			_, err := dial(tok, "").GetBlocks(ctx, []offload.Key{key(1)}, client.GetOptions{})
			if status.Code(err) != codes.Unauthenticated {
				rt.Fatalf("token %q: %v, want UNAUTHENTICATED", tok, err)
			}
		},
		"pin": func(rt *rapid.T) {
			tn := rapid.SampledFrom(tenants).Draw(rt, "tenant")
			ns := rapid.SampledFrom(namespaces[:2]).Draw(rt, "namespace")
			var ks []offload.Key
			for range rapid.IntRange(1, 4).Draw(rt, "keys") {
				ks = append(ks, key(keyGen.Draw(rt, "key")))
			}
			// Refusals past the pin budget are expected; a wrong answer to
			// rights is not.
			if _, err := tn.client.WithNamespace(ns).Pin(ctx, ks, time.Hour); err != nil && !allowed(tn, ns) != (status.Code(err) == codes.PermissionDenied) {
				rt.Fatalf("%s pin in %q: %v", tn.name, ns, err)
			}
		},
		"unpin": func(rt *rapid.T) {
			tn := rapid.SampledFrom(tenants).Draw(rt, "tenant")
			if _, err := tn.client.Unpin(ctx, []offload.Key{key(keyGen.Draw(rt, "key"))}); err != nil {
				rt.Fatalf("%s unpin: %v", tn.name, err)
			}
		},
		"request flood": func(rt *rapid.T) {
			tn := rapid.SampledFrom(tenants).Draw(rt, "tenant")
			for i := range rapid.IntRange(1, 64).Draw(rt, "requests") {
				version++
				if _, err := tn.client.NewRequest(ctx, fmt.Sprintf("flood-%d-%d", version, i), ""); err != nil {
					if status.Code(err) != codes.ResourceExhausted {
						rt.Fatalf("%s request flood: %v", tn.name, err)
					}
					break
				}
			}
		},
		"session kill": func(rt *rapid.T) {
			tn := rapid.SampledFrom(tenants).Draw(rt, "tenant")
			tn.client.Close()
			tn.client = dial(tn.token, "")
		},
		"admin reset": func(rt *rapid.T) {
			if rapid.IntRange(0, 5).Draw(rt, "rarely") != 0 {
				return
			}
			if err := admin.Reset(ctx); err != nil {
				rt.Fatal(err)
			}
		},
	})
}
