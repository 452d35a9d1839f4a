package fs

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/vfs"
	"github.com/kvtier/kvtier/vfs/vfstest"
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
	in := vfstest.NewInjector(vfs.OS(), func(op vfstest.Op, path string) *vfstest.Fault {
		if (op == vfstest.OpOpen || op == vfstest.OpRead) && strings.HasSuffix(path, ".bin") {
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

// Loads and stores have their own pools and queues: with the only read
// worker stuck and the load queue full, a store still runs and a further
// load is refused at once (bounded, never blocking the caller).
func TestReadAndWritePoolsAreSeparate(t *testing.T) {
	tier := newTier(t, t.TempDir(), func(c *Config) { c.ReadThreads, c.WriteThreads, c.QueueDepth = 1, 1, 1 })
	a := newArena(bs, 4, true)
	storeEach(t, tier, a, k(1))
	acquired, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	tier.hookAcquired = func(offload.Key) { once.Do(func() { close(acquired); <-release }) }
	tier.SubmitLoad(&offload.Job{ID: 1, Keys: []offload.Key{k(1)}, Slots: []int64{1}, Arena: a, Promotion: true})
	<-acquired
	tier.SubmitLoad(&offload.Job{ID: 2, Keys: []offload.Key{k(1)}, Slots: []int64{2}, Arena: a, Promotion: true}) // fills the load queue
	tier.SubmitLoad(&offload.Job{ID: 3, Keys: []offload.Key{k(1)}, Slots: []int64{3}, Arena: a, Promotion: true}) // refused
	storeAsync(tier, 4, a, k(2), 0)
	got := await(t, tier, 3, 4)
	close(release)
	if r := got[3]; r.Success || !errors.Is(r.Err, ErrQueueFull) {
		t.Fatalf("load over a full queue: %+v", r)
	}
	if r := got[4]; !r.Success {
		t.Fatalf("store while the read pool is stuck: %+v", r)
	}
	rest := await(t, tier, 1, 2)
	if !rest[1].Success || !rest[2].Success {
		t.Fatalf("queued loads: %+v", rest)
	}
}
