package fs

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/kvtier/kvtier/offload"
)

// benchDir is where benchmark files go: KVTIER_BENCH_DIR, or a temp dir
// under /tmp (same filesystem as the repository on the project machines).
func benchDir(b *testing.B) string {
	if d := os.Getenv("KVTIER_BENCH_DIR"); d != "" {
		dir, err := os.MkdirTemp(d, "fsbench")
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { os.RemoveAll(dir) })
		return dir
	}
	return b.TempDir()
}

const (
	benchBlock  = 2 << 20 // 2 MiB blocks
	benchBlocks = 32      // 64 MiB per round
	benchJob    = 4       // blocks per job, like one request's store batch
)

// BenchmarkThroughput2MiB compares, in the same run and on the same
// filesystem, storing and loading 2 MiB blocks through the tier with a
// raw sequential write and read of the same bytes into one file (both
// with O_DIRECT when the filesystem supports it, so the page cache
// flatters neither). It reports MB/s of each and the tier/raw ratios.
//
// Fairness: keys are hash-like (random fan-out directories, as vLLM's
// block hashes give, so a fresh tier creates directories as a real one
// does); each round runs raw and tier back to back, alternating which
// goes first so neither always meets the other's leftover writeback; and
// between rounds, untimed, the round's files are deleted and the
// filesystem synced, so a round's deletions (journal commits, discards)
// are not charged to the next round's first phase.
func BenchmarkThroughput2MiB(b *testing.B) {
	for _, format := range []string{"kvtier", "vllm"} {
		b.Run(format, func(b *testing.B) { benchThroughput(b, format) })
	}
}

func benchThroughput(b *testing.B, format string) {
	dir := benchDir(b)
	a := newArena(benchBlock, benchBlocks*2, true)
	for i := range benchBlocks {
		a.fill(int64(i), uint64(i))
	}
	threads := DefaultThreads
	if s := os.Getenv("KVTIER_BENCH_THREADS"); s != "" {
		if n, err := strconv.Atoi(s); err == nil && n > 0 {
			threads = n
		}
	}
	var rawW, rawR, tierW, tierR time.Duration
	var direct bool
	round := 0
	b.SetBytes(benchBlocks * benchBlock)
	for b.Loop() {
		b.StopTimer()
		round++
		root := filepath.Join(dir, fmt.Sprint(round))
		tier, err := New(testConfig(root, func(c *Config) {
			c.Format = format
			c.ReadThreads, c.WriteThreads = threads, threads
		}))
		if err != nil {
			b.Fatal(err)
		}
		direct = tier.Direct()
		raw := filepath.Join(root, "raw.bin")
		b.StartTimer()

		rawFirst := round%2 == 1
		pair := func(rawDur, tierDur *time.Duration, rawF, tierF func()) {
			if rawFirst {
				*rawDur += timeIt(rawF)
				*tierDur += timeIt(tierF)
			} else {
				*tierDur += timeIt(tierF)
				*rawDur += timeIt(rawF)
			}
		}
		pair(&rawW, &tierW, func() { rawWrite(b, raw, a, direct) }, func() { tierJobs(b, tier, a, false, round) })
		pair(&rawR, &tierR, func() { rawRead(b, raw, a, direct) }, func() { tierJobs(b, tier, a, true, round) })

		b.StopTimer()
		tier.Close(context.Background())
		os.RemoveAll(root)
		syncFS(b, dir)
		b.StartTimer()
	}
	mbps := func(d time.Duration) float64 {
		return float64(round*benchBlocks*benchBlock) / d.Seconds() / 1e6
	}
	b.ReportMetric(mbps(rawW), "raw-write-MB/s")
	b.ReportMetric(mbps(tierW), "store-MB/s")
	b.ReportMetric(mbps(rawR), "raw-read-MB/s")
	b.ReportMetric(mbps(tierR), "load-MB/s")
	b.ReportMetric(rawW.Seconds()/tierW.Seconds(), "store/raw")
	b.ReportMetric(rawR.Seconds()/tierR.Seconds(), "load/raw")
	if direct {
		b.ReportMetric(1, "odirect")
	} else {
		b.ReportMetric(0, "odirect")
	}
}

// syncFS flushes the filesystem holding dir (syncfs), so that deleting a
// round's files costs nothing in the next round.
func syncFS(b *testing.B, dir string) {
	f, err := os.Open(dir)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if err := syncfs(f); err != nil {
		b.Fatal(err)
	}
}

// hashKey is a key with a hash-like (uniformly spread) 32-byte hash, so
// blocks land in random fan-out directories as vLLM's do.
func hashKey(n int) offload.Key {
	h := sha256.Sum256([]byte(strconv.Itoa(n)))
	return offload.MakeKey(h[:], 0)
}

func timeIt(f func()) time.Duration {
	start := time.Now()
	f()
	return time.Since(start)
}

// rawWrite writes the arena's first benchBlocks slots sequentially into
// one file, 2 MiB per write.
func rawWrite(b *testing.B, name string, a *testArena, direct bool) {
	flag := os.O_CREATE | os.O_TRUNC | os.O_WRONLY
	if direct {
		flag |= oDirect
	}
	f, err := os.OpenFile(name, flag, 0o644)
	if err != nil {
		b.Fatal(err)
	}
	for i := range benchBlocks {
		if _, err := f.WriteAt(a.slot(int64(i)), int64(i)*benchBlock); err != nil {
			b.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		b.Fatal(err)
	}
}

// rawRead reads the raw file back into the second half of the arena.
func rawRead(b *testing.B, name string, a *testArena, direct bool) {
	flag := os.O_RDONLY
	if direct {
		flag |= oDirect
	}
	f, err := os.OpenFile(name, flag, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	for i := range benchBlocks {
		if _, err := f.ReadAt(a.slot(int64(benchBlocks+i)), int64(i)*benchBlock); err != nil {
			b.Fatal(err)
		}
	}
}

// tierJobs stores (or loads) the round's blocks through the tier in jobs
// of benchJob blocks and waits for all results.
func tierJobs(b *testing.B, tier *Tier, a *testArena, load bool, round int) {
	n := 0
	for first := 0; first < benchBlocks; first += benchJob {
		keys := make([]offload.Key, benchJob)
		slots := make([]int64, benchJob)
		for j := range benchJob {
			keys[j] = hashKey(round*1000 + first + j)
			slots[j] = int64(first + j)
			if load {
				slots[j] += benchBlocks
			}
		}
		job := &offload.Job{ID: uint64(first), Keys: keys, Slots: slots, Arena: a, Promotion: load}
		if load {
			tier.SubmitLoad(job)
		} else {
			tier.SubmitStore(job)
		}
		n++
	}
	if err := tier.DrainJobs(context.Background()); err != nil {
		b.Fatal(err)
	}
	res := tier.FinishedJobs()
	if len(res) != n {
		b.Fatalf("%d results for %d jobs", len(res), n)
	}
	for _, r := range res {
		if !r.Success {
			b.Fatalf("job failed: %+v", r)
		}
	}
}

// BenchmarkExistence1000 is the latency of one batch of 1 000 existence
// checks: 1 000 lookups (Retry), the step's flush, the worker's check,
// and 1 000 lookups answering from the verdicts. "indexed" keys are in
// the tier's index; "stat" keys are not (each costs a stat, the path for
// files another process wrote, and for misses).
func BenchmarkExistence1000(b *testing.B) {
	for _, indexed := range []bool{true, false} {
		name := map[bool]string{true: "indexed", false: "stat"}[indexed]
		b.Run(name, func(b *testing.B) {
			tier, err := New(testConfig(benchDir(b), nil))
			if err != nil {
				b.Fatal(err)
			}
			defer tier.Close(context.Background())
			keys := make([]offload.Key, 1000)
			for i := range keys {
				keys[i] = k(i)
			}
			if indexed {
				tier.mu.Lock()
				for _, key := range keys {
					tier.idx.insert(key, fileBytes)
				}
				tier.mu.Unlock()
			}
			want := offload.Miss
			if indexed {
				want = offload.Hit
			}
			b.ReportAllocs()
			n := 0
			for b.Loop() {
				n++
				r := offload.Background(fmt.Sprint("req", n))
				for _, key := range keys {
					tier.Lookup(key, r)
				}
				tier.OnScheduleEnd(offload.ScheduleEnd{})
				for tier.lookups.Pending() {
					time.Sleep(5 * time.Microsecond)
				}
				for _, key := range keys {
					if got := tier.Lookup(key, r); got != want {
						b.Fatalf("lookup = %v, want %v", got, want)
					}
				}
				tier.OnRequestFinished(r)
			}
		})
	}
}

// BenchmarkFsync2MiB measures the cost of the fsync settings on stores of
// 2 MiB blocks (jobs of 4, like BenchmarkThroughput2MiB) in the same run:
// every round stores the same blocks once per setting, rotating the
// order, into a fresh tier each time, and writes them raw into one file
// followed by one fsync (the durable-write baseline). It reports each
// setting's MB/s and its ratio to fsync none.
func BenchmarkFsync2MiB(b *testing.B) {
	for _, format := range []string{"kvtier", "vllm"} {
		b.Run(format, func(b *testing.B) { benchFsync(b, format) })
	}
}

func benchFsync(b *testing.B, format string) {
	dir := benchDir(b)
	a := newArena(benchBlock, benchBlocks, true)
	for i := range benchBlocks {
		a.fill(int64(i), uint64(i))
	}
	modes := []string{"none", "block", "batch"}
	took := make([]time.Duration, len(modes))
	var raw time.Duration
	round := 0
	b.SetBytes(benchBlocks * benchBlock)
	for b.Loop() {
		b.StopTimer()
		round++
		for j := range modes {
			i := (j + round) % len(modes)
			root := filepath.Join(dir, fmt.Sprint(round, modes[i]))
			tier, err := New(testConfig(root, func(c *Config) { c.Format, c.Fsync = format, modes[i] }))
			if err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			took[i] += timeIt(func() { tierJobs(b, tier, a, false, round) })
			b.StopTimer()
			direct := tier.Direct()
			tier.Close(context.Background())
			if j == 0 {
				name := filepath.Join(root, "raw.bin")
				raw += timeIt(func() {
					rawWrite(b, name, a, direct)
					f, err := os.OpenFile(name, os.O_WRONLY, 0)
					if err != nil {
						b.Fatal(err)
					}
					if err := f.Sync(); err != nil {
						b.Fatal(err)
					}
					f.Close()
				})
			}
			os.RemoveAll(root)
			syncFS(b, dir)
		}
		b.StartTimer()
	}
	mbps := func(d time.Duration) float64 {
		return float64(round*benchBlocks*benchBlock) / d.Seconds() / 1e6
	}
	b.ReportMetric(mbps(raw), "raw+fsync-MB/s")
	for i, m := range modes {
		b.ReportMetric(mbps(took[i]), m+"-MB/s")
		if i > 0 {
			b.ReportMetric(took[0].Seconds()/took[i].Seconds(), m+"/none")
		}
	}
}
