package fs

import (
	"testing"

	"github.com/kvtier/kvtier/keyspace"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/quota"
)

// A tenant flooding cascades into an fs tier with max_bytes evicts its own
// files and the pool's, never those of a tenant within its quota — also
// after a restart, which reads the files' owners from their keys.
func TestSharesKeepQuotaAcrossFloodAndRestart(t *testing.T) {
	acme, _ := keyspace.Tenant("acme")
	beta, _ := keyspace.Tenant("beta")
	dir := t.TempDir()
	cfg := func(c *Config) {
		c.MaxBytes = 10 * fileBytes // high 9.5 files, low 8.5
		c.Shares = []quota.Share{{Space: acme.ID(), Quota: 4 * fileBytes}, {Space: beta.ID(), Quota: 4 * fileBytes}}
	}
	tagged := func(sp keyspace.Space, from, n int) []offload.Key {
		var ks []offload.Key
		for i := from; i < from+n; i++ {
			ks = append(ks, sp.Key([]byte(k(i))))
		}
		return ks
	}
	a := newArena(bs, 4, true)
	tier := newTier(t, dir, cfg)
	storeEach(t, tier, a, tagged(acme, 0, 4)...)
	storeEach(t, tier, a, tagged(beta, 0, 30)...)
	for _, key := range tagged(acme, 0, 4) {
		if !onDisk(tier, key) {
			t.Fatalf("acme's %v evicted by beta's flood", key)
		}
	}
	if s := tier.Stats(); s.EvictedBlocks == 0 || s.UsedBytes > 10*fileBytes {
		t.Fatalf("stats %+v: the flood should have evicted beta's own files", s)
	}
	if err := tier.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	tier = newTier(t, dir, cfg)
	storeEach(t, tier, a, tagged(beta, 100, 30)...)
	for _, key := range tagged(acme, 0, 4) {
		if !onDisk(tier, key) {
			t.Fatalf("after a restart acme's %v was evicted by beta", key)
		}
	}
	// acme above its quota gives way to beta down to its quota.
	storeEach(t, tier, a, tagged(acme, 4, 4)...)
	storeEach(t, tier, a, tagged(beta, 200, 30)...)
	n := 0
	for _, key := range tagged(acme, 0, 8) {
		if onDisk(tier, key) {
			n++
		}
	}
	if n < 4 {
		t.Fatalf("acme holds %d files, below its quota of 4", n)
	}
}

func TestSharesConfigErrors(t *testing.T) {
	acme, _ := keyspace.Tenant("acme")
	for _, tc := range []struct {
		name   string
		max    int64
		shares []quota.Share
	}{
		{"unbounded tier", 0, []quota.Share{{Space: acme.ID(), Quota: 1}}},
		{"over max_bytes", 10, []quota.Share{{Space: acme.ID(), Quota: 11}}},
		{"space 0", 10, []quota.Share{{Space: 0, Quota: 1}}},
		{"twice", 10, []quota.Share{{Space: acme.ID(), Quota: 1}, {Space: acme.ID(), Quota: 1}}},
	} {
		c := testConfig(t.TempDir(), func(c *Config) { c.MaxBytes = 1 << 20; c.Shares = tc.shares })
		if tc.max == 0 {
			c.MaxBytes = 0
		} else {
			c.Shares[0].Quota *= 1 << 20 / 10
		}
		if tier, err := New(c); err == nil {
			tier.Close(t.Context())
			t.Errorf("%s: accepted", tc.name)
		}
	}
}
