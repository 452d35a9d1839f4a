package fs

import (
	"testing"

	"github.com/kvtier/kvtier/offload"
)

// OnRequestFinished drops the request's lookup state (§5.6 cleanup): the
// Miss a failed load pinned for the request goes, and a request that
// reuses the id probes afresh instead of inheriting it.
func TestRequestFinishedClearsLookupState(t *testing.T) {
	tier := newTier(t, t.TempDir(), nil)
	a := newArena(bs, 2, true)
	r := req("r")
	tier.Lookup(k(1), r) // queued, then pinned Miss by the failed load below
	if res := run(t, tier, true, a, r, []offload.Key{k(1)}, []int64{0}); res.Success {
		t.Fatalf("load of a block never stored: %+v", res)
	}
	run(t, tier, false, a, req("w"), []offload.Key{k(1)}, []int64{1})
	if got := lookupAll(t, tier, r, k(1)); got[0] != offload.Miss {
		t.Fatalf("request whose load failed = %v, want MISS without a re-probe", got[0])
	}
	tier.OnRequestFinished(r)
	if got := tier.Lookup(k(1), r); got != offload.Retry {
		t.Fatalf("reused request id after OnRequestFinished = %v, want RETRY (state cleaned up)", got)
	}
	if got := lookupAll(t, tier, r, k(1)); got[0] != offload.Hit {
		t.Fatalf("fresh probe = %v, want HIT", got[0])
	}
}
