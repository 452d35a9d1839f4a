package workload

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/kvtier/kvtier/config"
	"github.com/kvtier/kvtier/vfs"
	"github.com/kvtier/kvtier/vfs/vfstest"
)

// neverWorseMargin is how far below the primary alone a run may fall.
// Eviction takes a block back from a cascade in flight unless a tier is
// copying that very block at that moment (at most the tiers' writers'
// worth of blocks, of 3 000), so in practice the hit rate is the primary
// alone's. Before blocks could be taken back one by one, a started fs
// job kept all its blocks, and a run on a busy machine fell 0.0067 short
// (three fs tiers, nothing loaded from them).
const neverWorseMargin = 0.002

// A secondary tier never makes the cache worse than the primary alone
// (docs/design.md §7), at any tier speed and under any filter: random sets of
// memory and fs tiers, 0 to 50 ms per block (the memory tier's
// block_latency, the fs tier's writes and reads delayed through the vfs
// seam), bounded or unbounded concurrency, random load and store filters,
// in both replay modes. The primary alone is replayed the same way: a
// timed replay admits requests by step, not by wall-clock time, so the
// baseline does not depend on the machine's speed; only the tiers' does.
func TestTiersNeverWorseThanPrimaryAlone(t *testing.T) {
	if testing.Short() {
		t.Skip("replays the trace many times")
	}
	reqs := loadPrefix(t)[:1000]
	const primary = 3000
	base := func(timed bool) float64 {
		res, err := Replay(context.Background(), Requests(reqs), Options{PrimaryBlocks: primary, BlockBytes: 64, Timed: timed, Speedup: 400, Step: 5 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		return res.HitRate
	}
	baseline := map[bool]float64{false: base(false), true: base(true)}
	t.Logf("primary alone: %.4f sequential, %.4f timed", baseline[false], baseline[true])

	// The case CI found: three fs tiers, slow writes, nothing loaded from
	// them. Their started jobs once kept every block they had not yet
	// written.
	dir := t.TempDir()
	cfg, err := config.Parse(fmt.Appendf(nil, `secondary_tiers:
  - {name: t0, type: fs, root_dir: %q, locality: local, write_threads: 2, read_threads: 2}
  - {name: t1, type: fs, root_dir: %q, locality: local, write_threads: 4, read_threads: 2}
  - {name: t2, type: fs, root_dir: %q, locality: local, write_threads: 4, read_threads: 2}
`, dir+"/0", dir+"/1", dir+"/2"))
	if err != nil {
		t.Fatal(err)
	}
	res, err := Replay(context.Background(), Requests(reqs), Options{PrimaryBlocks: primary, BlockBytes: 64, Config: cfg,
		Params:  []byte(`{"kv_load_tiers":[{"medium":"cpu","locality":"remote"}],"kv_store_tiers":[{"locality":"local"}]}`),
		Speedup: 400, Step: 5 * time.Millisecond, SettleTimeout: 200 * time.Millisecond,
		FS: delayedFS(map[string]time.Duration{"t0": 5 * time.Millisecond, "t1": 5 * time.Millisecond, "t2": 5 * time.Millisecond})})
	if err != nil {
		t.Fatal(err)
	}
	if res.HitRate < baseline[false]-neverWorseMargin {
		t.Fatalf("three slow fs tiers: hit rate %.4f, primary alone %.4f\nresult %+v", res.HitRate, baseline[false], res)
	}

	latencies := []time.Duration{0, time.Millisecond, 5 * time.Millisecond, 20 * time.Millisecond, 50 * time.Millisecond}
	filters := []string{"", `[]`, `[{"medium":"cpu"}]`, `[{"medium":"storage"}]`, `[{"locality":"local"}]`, `[{"medium":"cpu","locality":"remote"}]`}
	// Each case replays the prefix once (about half a second, several
	// under the race detector): a bounded number of cases per run, a new
	// random set every run (-rapid.seed reproduces one).
	cases := 12
	if raceEnabled {
		cases = 5
	}
	run := 0
	rapid.Check(t, func(rt *rapid.T) {
		if run++; run > cases {
			return // rapid runs -rapid.checks cases; these are enough
		}
		var b strings.Builder
		b.WriteString("secondary_tiers:\n")
		delays := map[string]time.Duration{}
		n := rapid.IntRange(1, 3).Draw(rt, "tiers")
		for i := range n {
			name := fmt.Sprintf("t%d", i)
			lat := rapid.SampledFrom(latencies).Draw(rt, "latency")
			if rapid.Bool().Draw(rt, "fs") {
				fmt.Fprintf(&b, "  - {name: %s, type: fs, root_dir: %q, locality: %s, write_threads: %d, read_threads: 2}\n",
					name, fmt.Sprintf("%s/%d-%d", t.TempDir(), run, i), rapid.SampledFrom([]string{"local", "remote"}).Draw(rt, "fsLocality"), rapid.IntRange(1, 4).Draw(rt, "writers"))
				delays[name] = lat
				continue
			}
			fmt.Fprintf(&b, "  - {name: %s, type: memory, block_latency: %s, concurrency: %d, capacity_blocks: %d",
				name, lat, rapid.SampledFrom([]int{0, 1, 4}).Draw(rt, "concurrency"), rapid.SampledFrom([]int{0, 200, 2000}).Draw(rt, "capacity"))
			if m := rapid.SampledFrom([]string{"", "cpu", "storage"}).Draw(rt, "medium"); m != "" {
				fmt.Fprintf(&b, ", medium: %s", m)
			}
			if l := rapid.SampledFrom([]string{"", "local", "remote"}).Draw(rt, "locality"); l != "" {
				fmt.Fprintf(&b, ", locality: %s", l)
			}
			b.WriteString("}\n")
		}
		cfg, err := config.Parse([]byte(b.String()))
		if err != nil {
			rt.Fatalf("%v\n%s", err, b.String())
		}
		var params []string
		if f := rapid.SampledFrom(filters).Draw(rt, "load"); f != "" {
			params = append(params, `"kv_load_tiers":`+f)
		}
		if f := rapid.SampledFrom(filters).Draw(rt, "store"); f != "" {
			params = append(params, `"kv_store_tiers":`+f)
		}
		timed := rapid.Bool().Draw(rt, "timed")
		opts := Options{
			PrimaryBlocks: primary, BlockBytes: 64, Config: cfg,
			Params: []byte("{" + strings.Join(params, ",") + "}"),
			Timed:  timed, Speedup: 400, Step: 5 * time.Millisecond,
			SettleTimeout: 200 * time.Millisecond,
			FS:            delayedFS(delays),
		}
		res, err := Replay(context.Background(), Requests(reqs), opts)
		if err != nil {
			rt.Fatal(err)
		}
		if want := baseline[timed] - neverWorseMargin; res.HitRate < want {
			rt.Fatalf("hit rate %.4f with the tiers, %.4f with the primary alone (timed %v)\nconfig:\n%s\nparams %s\nresult %+v",
				res.HitRate, baseline[timed], timed, b.String(), opts.Params, res)
		}
	})
}

// delayedFS delays every read and write of the fs tiers in delays.
func delayedFS(delays map[string]time.Duration) func(tier string) vfs.FS {
	return func(tier string) vfs.FS {
		d := delays[tier]
		if d == 0 {
			return nil
		}
		return vfstest.NewInjector(vfs.OS(), func(op vfstest.Op, _ string) *vfstest.Fault {
			if op == vfstest.OpWrite || op == vfstest.OpRead {
				return &vfstest.Fault{Delay: d}
			}
			return nil
		})
	}
}
