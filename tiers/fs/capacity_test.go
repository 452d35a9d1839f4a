package fs

import (
	"bytes"
	"context"
	"errors"
	iofs "io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/vfs"
	"github.com/kvtier/kvtier/vfs/vfstest"
)

const fileBytes = bs + trailerLen

func storeEach(t *testing.T, tier *Tier, a *testArena, keys ...offload.Key) {
	t.Helper()
	for i, key := range keys {
		a.fill(int64(i%a.n), uint64(i))
		if res := run(t, tier, false, a, req("w"), []offload.Key{key}, []int64{int64(i % a.n)}); !res.Success {
			t.Fatalf("store %v: %+v", key, res)
		}
	}
}

func onDisk(tier *Tier, key offload.Key) bool {
	_, err := os.Stat(tier.Path(key))
	return err == nil
}

func TestEvictionLRUWithEvents(t *testing.T) {
	tier := newTier(t, t.TempDir(), func(c *Config) {
		c.MaxBytes = 10 * fileBytes // high 9.5 files, low 8.5 files
		c.Events = true
		c.Locality = "remote"
	})
	a := newArena(bs, 4, true)
	var keys []offload.Key
	for i := range 9 {
		keys = append(keys, k(i))
	}
	storeEach(t, tier, a, keys...)
	tier.TakeEvents()
	tier.Touch([]offload.Key{k(0)}, req("r")) // k0 becomes most recently used
	storeEach(t, tier, a, k(9))               // 10 files > 9.5: evict down to 8.5
	for _, key := range []offload.Key{k(1), k(2)} {
		if onDisk(tier, key) {
			t.Fatalf("%v not evicted", key)
		}
	}
	for _, key := range []offload.Key{k(0), k(3), k(9)} {
		if !onDisk(tier, key) {
			t.Fatalf("%v evicted", key)
		}
	}
	ev := tier.TakeEvents()
	want := []offload.Event{
		{Keys: []offload.Key{k(1), k(2)}, Medium: offload.MediumStorage, Locality: offload.LocalityRemote, Removed: true, Tier: "fs0"},
		{Keys: []offload.Key{k(9)}, Medium: offload.MediumStorage, Locality: offload.LocalityRemote, Tier: "fs0"},
	}
	if !eventsEqual(ev, want) {
		t.Fatalf("events %+v\nwant %+v", ev, want)
	}
	s := tier.Stats()
	if s.Files != 8 || s.UsedBytes != 8*fileBytes || s.EvictedBlocks != 2 || s.UsedBytes > int64(float64(10*fileBytes)*0.95) {
		t.Fatalf("stats %+v", s)
	}
	// Evicted keys are misses for lookups, kept ones hits.
	if got := lookupAll(t, tier, req("r"), k(1), k(0)); !slices.Equal(got, results(offload.Miss, offload.Hit)) {
		t.Fatalf("lookups after eviction = %v", got)
	}
}

func TestEvictionNeverTakesFileBeingRead(t *testing.T) {
	tier := newTier(t, t.TempDir(), func(c *Config) { c.MaxBytes = 3 * fileBytes; c.HighWatermark, c.LowWatermark = 1, 1 })
	a := newArena(bs, 4, true)
	storeEach(t, tier, a, k(1), k(2), k(3))
	want := slices.Clone(a.slot(0)) // k1's bytes (slot 0 filled with seed 0)
	acquired, release := make(chan struct{}), make(chan struct{})
	tier.hookAcquired = func(key offload.Key) {
		if key == k(1) {
			close(acquired)
			<-release
		}
	}
	tier.SubmitLoad(&offload.Job{ID: 50, Keys: []offload.Key{k(1)}, Slots: []int64{3}, Arena: a, Promotion: true})
	<-acquired
	// k1 is the LRU file but being read: the store evicts k2 instead.
	storeAsync(tier, 51, a, k(4), 1)
	if r := await(t, tier, 51)[51]; !r.Success {
		t.Fatalf("store while k1 is read: %+v", r)
	}
	if !onDisk(tier, k(1)) || onDisk(tier, k(2)) {
		t.Fatalf("evicted the file being read (k1 on disk %v, k2 on disk %v)", onDisk(tier, k(1)), onDisk(tier, k(2)))
	}
	close(release)
	res := collect(t, tier, 1)[0]
	if !res.Success || !bytes.Equal(a.slot(3), want) {
		t.Fatalf("load racing the eviction: %+v", res)
	}
}

func TestStoreFailsWhenOnlyReadFilesCouldGo(t *testing.T) {
	tier := newTier(t, t.TempDir(), func(c *Config) { c.MaxBytes = 1 * fileBytes; c.HighWatermark, c.LowWatermark = 1, 1 })
	a := newArena(bs, 4, true)
	storeEach(t, tier, a, k(1))
	acquired, release := make(chan struct{}), make(chan struct{})
	tier.hookAcquired = func(offload.Key) { close(acquired); <-release }
	tier.SubmitLoad(&offload.Job{ID: 60, Keys: []offload.Key{k(1)}, Slots: []int64{3}, Arena: a, Promotion: true})
	<-acquired
	storeAsync(tier, 61, a, k(2), 0)
	res := await(t, tier, 61)[61]
	close(release)
	if res.Success || !errors.Is(res.Err, ErrFull) {
		t.Fatalf("store with no evictable file: %+v", res)
	}
	if r := collect(t, tier, 1)[0]; !r.Success {
		t.Fatalf("load: %+v", r)
	}
	if s := tier.Stats(); s.Full != 1 || s.Files != 1 {
		t.Fatalf("stats %+v", s)
	}
}

func TestLoadDuringEvictionFailsCleanly(t *testing.T) {
	tier := newTier(t, t.TempDir(), func(c *Config) { c.MaxBytes = 2 * fileBytes; c.HighWatermark, c.LowWatermark = 1, 0.5 })
	a := newArena(bs, 4, true)
	storeEach(t, tier, a, k(1), k(2))
	evicting, resume := make(chan struct{}), make(chan struct{})
	tier.hookEvicting = func(key offload.Key) {
		if key == k(1) {
			close(evicting)
			<-resume
		}
	}
	tier.SubmitStore(&offload.Job{ID: 70, Keys: []offload.Key{k(3)}, Slots: []int64{0}, Arena: a})
	<-evicting
	// k1 is marked evicting but still on disk: a load must not serve it.
	tier.SubmitLoad(&offload.Job{ID: 71, Keys: []offload.Key{k(1)}, Slots: []int64{3}, Arena: a, Promotion: true})
	deadline := time.Now().Add(5 * time.Second)
	var loadRes []offload.JobResult
	for len(loadRes) == 0 && time.Now().Before(deadline) {
		loadRes = tier.FinishedJobs()
		time.Sleep(time.Millisecond)
	}
	close(resume)
	if len(loadRes) != 1 || loadRes[0].JobID != 71 || loadRes[0].Success || !errors.Is(loadRes[0].Err, os.ErrNotExist) {
		t.Fatalf("load of a file being evicted: %+v", loadRes)
	}
	if r := collect(t, tier, 1)[0]; r.JobID != 70 || !r.Success {
		t.Fatalf("store: %+v", r)
	}
	if onDisk(tier, k(1)) {
		t.Fatal("k1 still on disk")
	}
}

func TestRestartReindexes(t *testing.T) {
	dir := t.TempDir()
	tier := newTier(t, dir, nil)
	a := newArena(bs, 8, true)
	keys := []offload.Key{k(1), k(2), k(3)}
	for i := range keys {
		a.fill(int64(i), uint64(40+i))
	}
	run(t, tier, false, a, req("w"), keys, []int64{0, 1, 2})
	tier.Close(context.Background())
	// A leftover temp file and a foreign file in the tree.
	// A stale leftover temp file, a fresh one (another process may be
	// writing it) and a foreign file in the tree.
	leftover := tier.Path(k(1)) + "_dead.tmp"
	os.WriteFile(leftover, []byte("torn"), 0o644)
	age(t, leftover, DefaultStaleTmpAge+time.Minute)
	fresh := tier.Path(k(2)) + "_live.tmp"
	os.WriteFile(fresh, []byte("being written"), 0o644)
	os.WriteFile(filepath.Join(tier.lay.rankDir, "README"), []byte("x"), 0o644)

	tier2 := newTier(t, dir, nil)
	s := tier2.Stats()
	if s.Files != 3 || s.UsedBytes != 3*fileBytes || s.TempFilesRemoved != 1 {
		t.Fatalf("stats after restart %+v", s)
	}
	if _, err := os.Stat(leftover); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("stale temp file kept")
	}
	if _, err := os.Stat(fresh); err != nil {
		t.Fatalf("fresh temp file removed: %v", err)
	}
	if _, err := os.Stat(filepath.Join(tier2.lay.rankDir, "README")); err != nil {
		t.Fatal("foreign file removed")
	}
	// Served from the index (no stat needed) and byte-identical.
	if got := lookupAll(t, tier2, req("r"), keys...); !slices.Equal(got, results(offload.Hit, offload.Hit, offload.Hit)) {
		t.Fatalf("lookups after restart = %v", got)
	}
	if res := run(t, tier2, true, a, req("r"), keys, []int64{4, 5, 6}); !res.Success {
		t.Fatalf("load after restart: %+v", res)
	}
	for i := range keys {
		if !bytes.Equal(a.slot(int64(i)), a.slot(int64(4+i))) {
			t.Fatalf("block %d differs after restart", i)
		}
	}
}

func TestRestartOverCapacityEvictsOldest(t *testing.T) {
	dir := t.TempDir()
	tier := newTier(t, dir, nil)
	a := newArena(bs, 4, true)
	storeEach(t, tier, a, k(1), k(2), k(3), k(4))
	// Make k1 the oldest and k4 the newest regardless of write timing.
	now := time.Now()
	for i, key := range []offload.Key{k(1), k(2), k(3), k(4)} {
		ts := now.Add(time.Duration(i-10) * time.Minute)
		os.Chtimes(tier.Path(key), ts, ts)
	}
	tier.Close(context.Background())
	tier2 := newTier(t, dir, func(c *Config) { c.MaxBytes = 3 * fileBytes; c.Events = true })
	if onDisk(tier2, k(1)) || onDisk(tier2, k(2)) || !onDisk(tier2, k(3)) || !onDisk(tier2, k(4)) {
		t.Fatal("restart over capacity did not evict the oldest files")
	}
	if ev := tier2.TakeEvents(); len(ev) != 1 || !ev[0].Removed || !slices.Equal(ev[0].Keys, []offload.Key{k(1), k(2)}) {
		t.Fatalf("events %+v", ev)
	}
}

func tempFiles(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	filepath.WalkDir(root, func(p string, d iofs.DirEntry, err error) error {
		if err == nil && strings.HasSuffix(p, ".tmp") {
			out = append(out, p)
		}
		return nil
	})
	return out
}

func TestDiskFullMidJob(t *testing.T) {
	for _, fault := range []vfstest.Fault{{Err: syscall.ENOSPC}, {Short: true}, {Short: true, Err: syscall.ENOSPC}} {
		dir := t.TempDir()
		in := vfstest.NewInjector(vfs.OS(), nil)
		tier := newTier(t, dir, func(c *Config) { c.FS = in; c.Events = true })
		a := newArena(bs, 4, true)
		in.SetRule(vfstest.On(vfstest.OpWrite, k(2).HexHash(), fault))
		res := run(t, tier, false, a, req("w"), []offload.Key{k(1), k(2), k(3)}, []int64{0, 1, 2})
		if res.Success {
			t.Fatalf("%+v: store succeeded", fault)
		}
		if fault.Err != nil && !errors.Is(res.Err, syscall.ENOSPC) {
			t.Fatalf("%+v: error %v", fault, res.Err)
		}
		if tmp := tempFiles(t, dir); len(tmp) != 0 {
			t.Fatalf("%+v: temp files remain: %v", fault, tmp)
		}
		if !onDisk(tier, k(1)) || onDisk(tier, k(2)) || onDisk(tier, k(3)) {
			t.Fatalf("%+v: files k1 %v k2 %v k3 %v", fault, onDisk(tier, k(1)), onDisk(tier, k(2)), onDisk(tier, k(3)))
		}
		if ev := tier.TakeEvents(); ev != nil {
			t.Fatalf("%+v: events from a failed job: %+v", fault, ev)
		}
		if s := tier.Stats(); s.Files != 1 || s.UsedBytes != fileBytes {
			t.Fatalf("%+v: stats %+v", fault, s)
		}
		// The disk frees up: the same cascade succeeds.
		in.SetRule(nil)
		if res := run(t, tier, false, a, req("w"), []offload.Key{k(1), k(2), k(3)}, []int64{0, 1, 2}); !res.Success {
			t.Fatalf("%+v: retry: %+v", fault, res)
		}
	}
}

func TestCrashBetweenWriteAndRename(t *testing.T) {
	for name, rule := range map[string]vfstest.Rule{
		"before rename": vfstest.On(vfstest.OpRename, k(2).HexHash(), vfstest.Fault{Crash: true}),
		"torn write":    vfstest.On(vfstest.OpWrite, k(2).HexHash(), vfstest.Fault{Short: true, Crash: true}),
		"before close":  vfstest.On(vfstest.OpClose, k(2).HexHash(), vfstest.Fault{Crash: true}),
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			in := vfstest.NewInjector(vfs.OS(), rule)
			tier := newTier(t, dir, func(c *Config) { c.FS = in })
			a := newArena(bs, 4, true)
			a.fill(0, 1)
			a.fill(1, 2)
			res := run(t, tier, false, a, req("w"), []offload.Key{k(1), k(2)}, []int64{0, 1})
			if res.Success || !in.Crashed() {
				t.Fatalf("store through a crash: %+v", res)
			}
			if len(tempFiles(t, dir)) != 1 {
				t.Fatalf("expected the crashed temp file on disk, found %v", tempFiles(t, dir))
			}
			tier.Close(context.Background())

			// Restart on the real filesystem, the temp file stale by then.
			for _, p := range tempFiles(t, dir) {
				age(t, p, DefaultStaleTmpAge)
			}
			tier2 := newTier(t, dir, nil)
			if tmp := tempFiles(t, dir); len(tmp) != 0 {
				t.Fatalf("temp files after restart: %v", tmp)
			}
			if got := lookupAll(t, tier2, req("r"), k(1), k(2)); !slices.Equal(got, results(offload.Hit, offload.Miss)) {
				t.Fatalf("lookups after restart = %v, want HIT MISS", got)
			}
			if res := run(t, tier2, true, a, req("r"), []offload.Key{k(2)}, []int64{3}); res.Success {
				t.Fatal("served the torn block")
			}
			if res := run(t, tier2, true, a, req("r"), []offload.Key{k(1)}, []int64{3}); !res.Success || !bytes.Equal(a.slot(0), a.slot(3)) {
				t.Fatalf("complete block after restart: %+v", res)
			}
		})
	}
}

func TestCloseAnswersEveryJob(t *testing.T) {
	tier, err := New(testConfig(t.TempDir(), func(c *Config) { c.ReadThreads, c.QueueDepth = 1, 8 }))
	if err != nil {
		t.Fatal(err)
	}
	a := newArena(bs, 8, true)
	storeEach(t, tier, a, k(1), k(2), k(3))
	acquired, release := make(chan struct{}), make(chan struct{})
	var once bool
	tier.hookAcquired = func(offload.Key) {
		if !once {
			once = true
			close(acquired)
			<-release
		}
	}
	// Job 1 blocks on its first block; jobs 2..5 wait in the queue.
	tier.SubmitLoad(&offload.Job{ID: 1, Keys: []offload.Key{k(1), k(2), k(3)}, Slots: []int64{4, 5, 6}, Arena: a, Promotion: true})
	<-acquired
	for id := uint64(2); id <= 5; id++ {
		tier.SubmitLoad(&offload.Job{ID: id, Keys: []offload.Key{k(1)}, Slots: []int64{7}, Arena: a, Promotion: true})
	}
	closed := make(chan error)
	go func() { closed <- tier.Close(context.Background()) }()
	for !tier.closing.Load() { // job 1 must see the close after its first block
		time.Sleep(time.Millisecond)
	}
	close(release)
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	tier.SubmitStore(&offload.Job{ID: 6, Keys: []offload.Key{k(9)}, Slots: []int64{0}, Arena: a})
	res := tier.FinishedJobs()
	seen := map[uint64]offload.JobResult{}
	for _, r := range res {
		if _, dup := seen[r.JobID]; dup {
			t.Fatalf("job %d answered twice", r.JobID)
		}
		seen[r.JobID] = r
	}
	if len(seen) != 6 {
		t.Fatalf("%d of 6 jobs answered: %+v", len(seen), res)
	}
	// Job 1 stopped after its current block and reports the prefix.
	if r := seen[1]; r.Success || !errors.Is(r.Err, ErrClosed) || !slices.Equal(r.SuccessfulKeys, []offload.Key{k(1)}) {
		t.Fatalf("job 1: %+v", r)
	}
	for id := uint64(2); id <= 6; id++ {
		if r := seen[id]; r.Success || !errors.Is(r.Err, ErrClosed) {
			t.Fatalf("job %d: %+v", id, r)
		}
	}
	if tier.HasPendingWork() {
		t.Fatal("pending work after Close and collection")
	}
	if err := tier.DrainJobs(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestQueueFullFailsAtOnce(t *testing.T) {
	tier := newTier(t, t.TempDir(), func(c *Config) { c.ReadThreads, c.QueueDepth = 1, 1 })
	a := newArena(bs, 4, true)
	storeEach(t, tier, a, k(1))
	acquired, release := make(chan struct{}), make(chan struct{})
	var once bool
	tier.hookAcquired = func(offload.Key) {
		if !once {
			once = true
			close(acquired)
			<-release
		}
	}
	tier.SubmitLoad(&offload.Job{ID: 1, Keys: []offload.Key{k(1)}, Slots: []int64{1}, Arena: a, Promotion: true})
	<-acquired
	tier.SubmitLoad(&offload.Job{ID: 2, Keys: []offload.Key{k(1)}, Slots: []int64{2}, Arena: a, Promotion: true})
	tier.SubmitLoad(&offload.Job{ID: 3, Keys: []offload.Key{k(1)}, Slots: []int64{3}, Arena: a, Promotion: true})
	res := tier.FinishedJobs()
	if len(res) != 1 || res[0].JobID != 3 || !errors.Is(res[0].Err, ErrQueueFull) || !errors.Is(res[0].Err, offload.ErrRefused) {
		t.Fatalf("immediate results %+v, want job 3 refused with ErrQueueFull", res)
	}
	if reason, ok := offload.RefusalReason(res[0].Err); !ok || reason != offload.RefusedQueueFull {
		t.Fatalf("refusal reason %q, %v", reason, ok)
	}
	if q, c := tier.QueuedJobs(); q != 1 || c != 2 {
		t.Fatalf("QueuedJobs = %d of %d, want job 2 queued of 2 (one per pool)", q, c)
	}
	close(release)
	res = collect(t, tier, 2)
	for _, r := range res {
		if !r.Success {
			t.Fatalf("queued job failed: %+v", r)
		}
	}
	if tier.Stats().QueueFull != 1 {
		t.Fatal("queue-full rejection not counted")
	}
}

// A queued job can be withdrawn: it is never answered, never touches its
// slots, and drains count it done; a started job cannot be.
func TestCancelQueued(t *testing.T) {
	tier := newTier(t, t.TempDir(), func(c *Config) { c.WriteThreads, c.QueueDepth = 1, 4 })
	a := newArena(bs, 4, true)
	started, release := make(chan struct{}), make(chan struct{})
	var once bool
	tier.hookStoreStart = func() {
		if !once {
			once = true
			close(started)
			<-release
		}
	}
	tier.SubmitStore(&offload.Job{ID: 1, Keys: []offload.Key{k(1)}, Slots: []int64{0}, Arena: a})
	<-started
	tier.SubmitStore(&offload.Job{ID: 2, Keys: []offload.Key{k(2)}, Slots: []int64{1}, Arena: a})
	if tier.CancelQueued(1) {
		t.Fatal("withdrew a started job")
	}
	if !tier.CancelQueued(2) || tier.CancelQueued(2) {
		t.Fatal("CancelQueued of the queued job: want true once")
	}
	if q, _ := tier.QueuedJobs(); q != 0 {
		t.Fatalf("%d jobs queued after the withdrawal", q)
	}
	close(release)
	res := collect(t, tier, 1)
	if res[0].JobID != 1 || !res[0].Success {
		t.Fatalf("results %+v, want only job 1, done", res)
	}
	if err := tier.DrainJobs(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(tier.Path(k(2))); !errors.Is(err, os.ErrNotExist) || tier.Stats().Cancelled != 1 {
		t.Fatalf("withdrawn block: stat %v, cancelled %d", err, tier.Stats().Cancelled)
	}
	if tier.Len() != 1 {
		t.Fatalf("tier holds %d blocks, want 1", tier.Len())
	}
	if got := tier.FinishedJobs(); len(got) != 0 {
		t.Fatalf("withdrawn job answered: %+v", got)
	}
}

// TestIndexEntrySize checks the documented bound of ≤ 128 bytes of index
// metadata per block (entry, map slot and the 36-byte key).
func TestIndexEntrySize(t *testing.T) {
	const n = 200_000
	keys := make([]offload.Key, n)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	x := newIndex()
	for i := range keys {
		h := make([]byte, 32)
		h[0], h[1], h[2] = byte(i), byte(i>>8), byte(i>>16)
		keys[i] = offload.MakeKey(h, 0)
		x.insert(keys[i], 2<<20)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	per := float64(after.HeapAlloc-before.HeapAlloc) / n
	t.Logf("index: %.1f bytes per entry (36-byte keys)", per)
	if per > 128 {
		t.Fatalf("%.1f bytes per index entry, want ≤ 128", per)
	}
	runtime.KeepAlive(keys)
	runtime.KeepAlive(&x)
}

// TestEventsTrackContentsWhenAJobEvictsItself replays the tier's events as
// a router does: a store job larger than max_bytes evicts blocks it wrote
// itself, and its stored event must not announce them after their removal.
func TestEventsTrackContentsWhenAJobEvictsItself(t *testing.T) {
	tier := newTier(t, t.TempDir(), func(c *Config) {
		c.MaxBytes = 2 * fileBytes
		c.HighWatermark, c.LowWatermark = 1, 1
		c.Events = true
	})
	a := newArena(bs, 4, true)
	storeEach(t, tier, a, k(0))
	keys := []offload.Key{k(0), k(1), k(2), k(3)}
	if res := run(t, tier, false, a, req("w"), keys, []int64{0, 1, 2, 3}); !res.Success {
		t.Fatalf("store: %+v", res)
	}
	seen := map[offload.Key]bool{}
	for _, ev := range tier.TakeEvents() {
		for _, key := range ev.Keys {
			seen[key] = !ev.Removed
		}
	}
	for _, key := range keys {
		if seen[key] != onDisk(tier, key) {
			t.Errorf("%v: on disk %v, events say %v", key, onDisk(tier, key), seen[key])
		}
	}
}
