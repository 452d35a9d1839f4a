package remotetest

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/kvtier/kvtier/keyspace"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/quota"
	"github.com/kvtier/kvtier/tiers/remote"
)

// BudgetCase is a remote tier with max_bytes against its real server.
type BudgetCase struct {
	// New builds the tier over the same server and key prefix each
	// time, with max_bytes and the tenants' shares given; the runner
	// closes it.
	New func(ctx context.Context, maxBytes int64, shares []quota.Share) (offload.SecondaryTier, error)
	// Held lists the tier's blocks the server holds (a raw client's
	// listing, not the tier's).
	Held func(t testing.TB) []offload.Key
}

// RunBudget checks max_bytes and tenants' quotas on a real server.
// Tenant a (quota 4 blocks) stores 4 blocks, tenant b (quota 2) floods
// 20: the server never holds more than max_bytes (8 blocks) of the
// tier's, none of a's blocks goes, and a's blocks load with their bytes.
// Then a stores 4 more: b is evicted down to its quota, not below it. A
// tier built again over the same server counts what the server holds,
// and one with a smaller max_bytes deletes down to it at startup.
func RunBudget(t *testing.T, c BudgetCase) {
	const slot = 4096
	size := int64(slot + remote.HeaderSize)
	sa, _ := keyspace.Tenant("a")
	sb, _ := keyspace.Tenant("b")
	shares := []quota.Share{{Space: sa.ID(), Quota: 4 * size}, {Space: sb.ID(), Quota: 2 * size}}
	ctx := context.Background()
	build := func(maxBytes int64, shares []quota.Share) offload.SecondaryTier {
		t.Helper()
		tier, err := c.New(ctx, maxBytes, shares)
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		return tier
	}
	closeTier := func(tier offload.SecondaryTier) {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		tier.Close(cctx)
	}
	tier := build(8*size, shares)
	arena := NewArena(slot, 64)
	key := func(s keyspace.Space, i int) offload.Key { return s.Key([]byte(Key(i))) }
	var aKeys []offload.Key
	id := uint64(0)
	store := func(keys []offload.Key, from int) offload.JobResult {
		id++
		for i := range keys {
			arena.Fill(int64(from+i), uint64(from+i))
		}
		return Run(t, tier, StoreJob(id, arena, keys, Slots(from, len(keys))))
	}
	owned := func(s keyspace.Space) (n int) {
		for _, k := range c.Held(t) {
			if id, _ := keyspace.IDOf(k); id == s.ID() {
				n++
			}
		}
		return n
	}
	for i := range 4 {
		aKeys = append(aKeys, key(sa, i))
	}
	if r := store(aKeys, 0); !r.Success {
		t.Fatalf("a's store: %v", r.Err)
	}
	for j := range 10 {
		ks := []offload.Key{key(sb, 2*j), key(sb, 2*j+1)}
		if r := store(ks, 8+2*j); !r.Success {
			t.Fatalf("b's store %d: %v", j, r.Err)
		}
		if n := len(c.Held(t)); n > 8 {
			t.Fatalf("after b's store %d the server holds %d blocks of the tier, max_bytes allows 8", j, n)
		}
		if n := owned(sa); n != 4 {
			t.Fatalf("after b's store %d a holds %d blocks on the server, want its 4 (within its quota)", j, n)
		}
	}
	// a's blocks load with their bytes.
	id++
	if r := Run(t, tier, LoadJob(id, arena, aKeys, Slots(40, 4), offload.Background("ra"))); !r.Success {
		t.Fatalf("loading a's blocks: %v", r.Err)
	}
	for i := range 4 {
		want, _ := arena.Slot(int64(i))
		got, _ := arena.Slot(int64(40 + i))
		if !bytes.Equal(got, want) {
			t.Fatalf("a's block %d loaded other bytes", i)
		}
	}
	rep := tier.(offload.Reporter).Report()
	if rep.OccupancyBlocks != 8 || rep.OccupancyBytes != 8*size || rep.Evictions != 16 {
		t.Fatalf("report: %d blocks, %d bytes, %d evictions; want 8, %d, 16", rep.OccupancyBlocks, rep.OccupancyBytes, rep.Evictions, 8*size)
	}
	if i := slices.IndexFunc(rep.Shares, func(s offload.ShareReport) bool { return s.Space == sa.ID() }); i < 0 || rep.Shares[i].Bytes != 4*size || rep.Shares[i].Quota != 4*size {
		t.Fatalf("a's share in the report: %+v", rep.Shares)
	}
	// a stores 4 more: b (4 blocks, quota 2) gives first, and never
	// goes below its quota.
	var more []offload.Key
	for i := range 4 {
		more = append(more, key(sa, 10+i))
	}
	if r := store(more, 50); !r.Success {
		t.Fatalf("a's second store: %v", r.Err)
	}
	if nb, na := owned(sb), owned(sa); nb < 2 || nb > 3 || na+nb != 8 {
		t.Fatalf("after a's second store: a %d, b %d blocks on the server; want b to give 1 or 2 and keep its quota of 2, 8 in all", na, nb)
	}
	closeTier(tier)

	// Built again: the server's blocks are counted.
	tier = build(8*size, shares)
	rep = tier.(offload.Reporter).Report()
	if rep.OccupancyBlocks != 8 || rep.OccupancyBytes != 8*size {
		t.Fatalf("after a restart the ledger counts %d blocks, %d bytes; the server holds 8", rep.OccupancyBlocks, rep.OccupancyBytes)
	}
	closeTier(tier)
	// With less room: deleted down to it at startup, from the owners
	// above their quotas only.
	tier = build(4*size, []quota.Share{{Space: sa.ID(), Quota: 2 * size}, {Space: sb.ID(), Quota: 2 * size}})
	defer closeTier(tier)
	if n := len(c.Held(t)); n != 4 {
		t.Fatalf("a tier with max_bytes of 4 blocks left %d on the server", n)
	}
	if na, nb := owned(sa), owned(sb); na != 2 || nb != 2 {
		t.Fatalf("after the trim a holds %d and b %d blocks; want each its quota of 2", na, nb)
	}
	// Tenant b at its quota, a at its own, no pool: b's store evicts
	// b's own oldest; a job of more blocks than the whole capacity
	// cannot be admitted and fails with ErrFull, writing nothing.
	var big []offload.Key
	for i := range 5 {
		big = append(big, key(sb, 30+i))
	}
	r := store(big, 20)
	if r.Success || !errors.Is(r.Err, remote.ErrFull) {
		t.Fatalf("a job larger than max_bytes: success %v, err %v; want ErrFull", r.Success, r.Err)
	}
	if n := len(c.Held(t)); n != 4 {
		t.Fatalf("after a refused job the server holds %d blocks, want 4", n)
	}
	if rep := tier.(offload.Reporter).Report(); rep.Remote == nil || rep.Remote.StoresFull != 1 {
		t.Fatalf("report after a refused job: %+v, want StoresFull 1", rep.Remote)
	}
}
