package server_test

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvtier/kvtier/offload"
)

// A block that answered HIT to one client's Lookup and that another
// client's stores evicted before the first client's PrepareLoad: without
// allow_missing the call fails (FAILED_PRECONDITION, saying why) and pins
// nothing; with it the block is a miss (slot -1, counted in missing) and
// the rest are pinned. Both count in kvtier_prepare_load_missing_total.
func TestPrepareLoadOfABlockEvictedSinceTheLookup(t *testing.T) {
	e := startEnv(t, envOptions{slots: 4, tiers: func(envT) []offload.SecondaryTier { return nil }})
	ctx := context.Background()
	a, b := e.dial(t, e.unix), e.dial(t, e.unix)
	arena, err := a.MapArena(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer arena.Close()
	if _, err := a.NewRequest(ctx, "a", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := b.NewRequest(ctx, "b", ""); err != nil {
		t.Fatal(err)
	}
	storeViaArena(t, ctx, a, arena, "a", keys(0, 4))
	lookupUntil(t, ctx, a, "a", keys(0, 4))
	// B's store of 2 new blocks evicts the 2 least recently used: 0 and 1.
	storeViaArena(t, ctx, b, arena, "b", keys(10, 2))

	if _, err := a.PrepareLoad(ctx, "a", keys(0, 4)); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "allow_missing") {
		t.Fatalf("PrepareLoad of evicted blocks: %v, want FAILED_PRECONDITION naming allow_missing", err)
	}
	if st, err := a.Stats(ctx); err != nil || st.GetPrimary().GetPinnedSlots() != 0 {
		t.Fatalf("a failed PrepareLoad left slots pinned: %v %v", st.GetPrimary(), err)
	}
	slots, missing, err := a.PrepareLoadPresent(ctx, "a", keys(0, 4))
	if err != nil || missing != 2 || slots[0] != -1 || slots[1] != -1 || slots[2] < 0 || slots[3] < 0 {
		t.Fatalf("PrepareLoadPresent: slots %v, %d missing, %v; want 0 and 1 missing", slots, missing, err)
	}
	for i := 2; i < 4; i++ {
		got, err := arena.Slot(slots[i])
		if err != nil || string(got) != string(block(key(i))) {
			t.Fatalf("block %d: %v", i, err)
		}
	}
	if err := a.CompleteLoad(ctx, "a", keys(2, 2)); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(scrape(t, e), `kvtier_prepare_load_missing_total{namespace=""} 3`) {
		t.Fatal("kvtier_prepare_load_missing_total does not count the 3 keys")
	}
}
