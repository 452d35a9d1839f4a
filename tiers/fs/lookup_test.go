package fs

import (
	"bytes"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/vfs"
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

// A restart rebuilds the index from names and sizes alone: no block file
// is opened, neither at start-up nor by the existence checks that follow
// (the index answers them), yet the blocks are then served.
func TestRestartOpensNoBlockFile(t *testing.T) {
	dir := t.TempDir()
	tier := newTier(t, dir, nil)
	a := newArena(bs, 6, true)
	keys := []offload.Key{k(1), k(2), k(3)}
	for i := range keys {
		a.fill(int64(i), uint64(60+i))
	}
	run(t, tier, false, a, req("w"), keys, []int64{0, 1, 2})
	tier.Close(t.Context())

	var mu sync.Mutex
	var opened []string
	in := vfs.NewInjector(vfs.OS(), func(op vfs.Op, path string) *vfs.Fault {
		if (op == vfs.OpOpen || op == vfs.OpRead) && strings.HasSuffix(path, ".bin") {
			mu.Lock()
			opened = append(opened, op.String()+" "+path)
			mu.Unlock()
		}
		return nil
	})
	tier2 := newTier(t, dir, func(c *Config) { c.FS = in })
	if s := tier2.Stats(); s.Files != 3 || s.UsedBytes != 3*fileBytes {
		t.Fatalf("index after restart: %+v", s)
	}
	if got := lookupAll(t, tier2, req("r"), keys...); !slices.Equal(got, results(offload.Hit, offload.Hit, offload.Hit)) {
		t.Fatalf("lookups after restart = %v", got)
	}
	mu.Lock()
	if len(opened) != 0 {
		t.Fatalf("restart and lookups read block files: %v", opened)
	}
	mu.Unlock()
	if res := run(t, tier2, true, a, req("r"), keys, []int64{3, 4, 5}); !res.Success {
		t.Fatalf("load after restart: %+v", res)
	}
	for i := range keys {
		if !bytes.Equal(a.slot(int64(i)), a.slot(int64(3+i))) {
			t.Fatalf("block %d differs after restart", i)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(opened) == 0 {
		t.Fatal("the probe saw no block file opened even by the load")
	}
}
