package server_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"net"
	"testing"
	"time"

	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/cpu"
	"github.com/kvtier/kvtier/keyspace"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/server"
	rt "github.com/kvtier/kvtier/tiers/remote/remotetest"
)

// TestStreamHoldsCountAgainstTheirTenant: slots a tenant's stream gets
// keep pinned count against its own quota. acme fills the whole primary
// (it borrows what beta does not use) and opens gets it never reads, one
// per quarter of the primary: only its quota's worth is pinned, the rest
// are refused, so beta can still store its quota — evicting acme's
// borrowed blocks, never its own.
func TestStreamHoldsCountAgainstTheirTenant(t *testing.T) {
	const size = 1 << 20 // 16 unread blocks are far more than the sockets buffer
	acmeSp, _ := keyspace.Tenant("acme")
	betaSp, _ := keyspace.Tenant("beta")
	e := startEnvSlot(t, envOptions{
		slots: 64, token: "admin-token", stream: true, tiers: noTiers,
		tenants: []server.TenantConfig{
			{Name: "acme", Token: "acme-token", Namespaces: []string{""}},
			{Name: "beta", Token: "beta-token", Namespaces: []string{""}},
		},
		shares: []cpu.Share{{Space: acmeSp.ID(), Slots: 16}, {Space: betaSp.ID(), Slots: 16}},
	}, size)
	ctx := ctxT(t)
	acme, err := client.Dial(e.tcp, client.Options{Token: "acme-token", NoStream: true})
	if err != nil {
		t.Fatal(err)
	}
	defer acme.Close()
	beta, err := client.Dial(e.tcp, client.Options{Token: "beta-token", NoStream: true})
	if err != nil {
		t.Fatal(err)
	}
	defer beta.Close()
	put := func(c *client.Client, ks []offload.Key, fill byte) []bool {
		t.Helper()
		var ok []bool
		for i := 0; i < len(ks); i += 8 {
			blocks := make([]client.Block, 0, 8)
			for _, k := range ks[i:min(i+8, len(ks))] {
				blocks = append(blocks, client.Block{Key: k, Data: bytes.Repeat([]byte{fill}, size)})
			}
			got, err := c.PutBlocks(ctx, blocks, client.CallOptions{})
			if err != nil {
				t.Fatal(err)
			}
			ok = append(ok, got...)
		}
		return ok
	}
	for _, ok := range put(acme, keys(0, 64), 'a') {
		if !ok {
			t.Fatal("acme could not fill the idle primary")
		}
	}
	pinned := func() int64 {
		st, err := e.dial(t, e.tcp).Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return st.GetPrimary().GetPinnedSlots()
	}
	// Four gets of 16 blocks, never read.
	conns := make([]net.Conn, 4)
	for i := range conns {
		c, _, hs := streamHello(t, e.srv.StreamAddr(), "acme-token", "")
		if hs != 0 {
			t.Fatalf("hello %d", hs)
		}
		conns[i] = c
		req := binary.BigEndian.AppendUint32(nil, 16)
		for _, k := range keys(16*i, 16) {
			req = binary.BigEndian.AppendUint16(req, uint16(len(k)))
			req = append(req, k...)
		}
		if _, err := c.Write(req); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			rt.Eventually(t, 10*time.Second, "the first get pins its blocks", func() bool { return pinned() == 16 })
		}
	}
	body := scrapeUntil(t, e, func(p string) bool {
		v, _ := metricValue(p, "kvtier_tenant_hold_refusals_total")
		return v >= 3
	})
	if v, _ := metricValue(body, "kvtier_tenant_hold_refusals_total"); v != 3 {
		t.Fatalf("refused gets past acme's quota: %v, want 3", v)
	}
	if n := pinned(); n != 16 {
		t.Fatalf("%d slots pinned, want acme's quota (16)", n)
	}
	for i, ok := range put(beta, keys(1000, 16), 'b') {
		if !ok {
			t.Fatalf("beta, within its quota, could not store block %d", i)
		}
	}
	for i, k := range keys(1000, 16) {
		b, err := beta.GetBlocks(ctx, []offload.Key{k}, client.GetOptions{})
		if err != nil || b.Hits != 1 || b.Data[0][0] != 'b' {
			t.Fatalf("beta's block %d: %v %v", i, b, err)
		}
	}
	// acme's gets' pins go when their connections do.
	for _, c := range conns {
		c.Close()
	}
	rt.Eventually(t, 10*time.Second, "acme's pins released", func() bool { return pinned() == 0 })
}

// TestPinsAndHoldsShareTheQuota: a tenant's router pins and its stream
// requests' holds together stay within its quota, in either order. acme
// borrows most of a primary the quotas divide whole, holds its quota in an
// unread get, then asks to pin two more blocks: refused, so beta can still
// fill its own quota without evicting its own blocks.
func TestPinsAndHoldsShareTheQuota(t *testing.T) {
	const size = 1 << 20
	acmeSp, _ := keyspace.Tenant("acme")
	betaSp, _ := keyspace.Tenant("beta")
	e := startEnvSlot(t, envOptions{
		slots: 16, token: "admin-token", stream: true, tiers: noTiers,
		tenants: []server.TenantConfig{
			{Name: "acme", Token: "acme-token", Namespaces: []string{""}},
			{Name: "beta", Token: "beta-token", Namespaces: []string{""}},
		},
		shares: []cpu.Share{{Space: acmeSp.ID(), Slots: 8}, {Space: betaSp.ID(), Slots: 8}},
	}, size)
	ctx := ctxT(t)
	dial := func(token string) *client.Client {
		c, err := client.Dial(e.tcp, client.Options{Token: token, NoStream: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	acme, beta := dial("acme-token"), dial("beta-token")
	put := func(c *client.Client, ks []offload.Key) {
		t.Helper()
		for _, k := range ks {
			if got, err := c.PutBlocks(ctx, []client.Block{{Key: k, Data: bytes.Repeat([]byte{k[len(k)-5]}, size)}}, client.CallOptions{}); err != nil || !got[0] {
				t.Fatalf("put: %v %v", got, err)
			}
		}
	}
	put(beta, keys(0, 2))
	put(acme, keys(100, 14)) // 6 borrowed from beta's quota
	conn, _, hs := streamHello(t, e.srv.StreamAddr(), "acme-token", "")
	if hs != 0 {
		t.Fatalf("hello %d", hs)
	}
	req := binary.BigEndian.AppendUint32(nil, 8)
	for _, k := range keys(100, 8) {
		req = binary.BigEndian.AppendUint16(req, uint16(len(k)))
		req = append(req, k...)
	}
	if _, err := conn.Write(req); err != nil {
		t.Fatal(err)
	}
	pinned := func() int64 {
		st, err := e.dial(t, e.tcp).Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return st.GetPrimary().GetPinnedSlots()
	}
	rt.Eventually(t, 10*time.Second, "the unread get pins acme's quota", func() bool { return pinned() == 8 })
	a, err := acme.Pin(ctx, keys(108, 2), time.Hour)
	if err != nil || a.GetPinned() != 0 || a.GetRefused() != 2 {
		t.Fatalf("acme pins past its quota: %v %v", a, err)
	}
	admin := e.dial(t, e.tcp)
	before := tenantEvictions(t, admin, "beta")
	put(beta, keys(2, 6)) // beta fills its quota: acme's 6 borrowed blocks go
	if n := tenantEvictions(t, admin, "beta"); n != before {
		t.Fatalf("beta evicted %d of its own blocks", n-before)
	}
	conn.Close()
}

// tenantEvictions is the evicted-block count of tenant name, as the
// admin's Stats (on admin) reports it.
func tenantEvictions(t envT, admin *client.Client, name string) uint64 {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := admin.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, ts := range st.GetTenants() {
		if ts.GetName() == name {
			return ts.GetEvicted()
		}
	}
	t.Fatalf("no tenant %q in Stats", name)
	return 0
}
