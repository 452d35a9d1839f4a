package region

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvtier/kvtier/filemapper"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/tiering"
	"github.com/kvtier/kvtier/tiers/fs"
	"github.com/kvtier/kvtier/tiers/memory"
)

// BenchmarkRegionToFS2MiB compares, in the same run and on the same
// filesystem, storing 2 MiB blocks from an engine's region through the
// region service (tier mode: engine jobs, the namespace's stack, the fs
// tier) with the fs tier's own throughput for the same blocks submitted
// to it directly. Rounds alternate which goes first; each writes into a
// fresh directory. KVTIER_BENCH_DIR picks the filesystem (default: a temp
// dir); the region file lives in /dev/shm when it exists, as vLLM's does.
func BenchmarkRegionToFS2MiB(b *testing.B) {
	const block, blocks, perJob = 2 << 20, 32, 4
	dir := b.TempDir()
	if d := os.Getenv("KVTIER_BENCH_DIR"); d != "" {
		var err error
		if dir, err = os.MkdirTemp(d, "regionbench"); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { os.RemoveAll(dir) })
	}
	shm := b.TempDir()
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		shm = "/dev/shm"
	}
	l := Layout{NumBlocks: blocks, RowStride: block, BlocksPerChunk: 1, Model: "bench", DType: "float16", WorldSize: 1}
	f, err := os.CreateTemp(shm, "kvtier-bench-region-*")
	if err != nil {
		b.Fatal(err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	if err := f.Truncate(l.Size()); err != nil {
		b.Fatal(err)
	}
	m, err := mapRegion(f, l)
	if err != nil {
		b.Fatal(err)
	}
	defer m.unmap()
	for i := range blocks {
		s, _ := m.Slot(int64(i))
		for j := range s {
			s[j] = byte(i*7 + j)
		}
	}
	round := 0
	fsConfig := func(root string) fs.Config {
		return fs.Config{Name: "disk", RootDir: root, Locality: "local", Namespace: filemapper.Namespace{ModelName: "bench", BlockBytes: block}}
	}
	keyOf := func(i int) offload.Key { return offload.MakeKey([]byte(fmt.Sprintf("bench-%06d-%04d", round, i)), 0) }

	var viaRegion, direct time.Duration
	runRegion := func() {
		root := filepath.Join(dir, fmt.Sprint("r", round))
		svc, err := New(Config{
			Tiers: func(context.Context, string, Layout) ([]offload.SecondaryTier, error) {
				t, err := fs.New(fsConfig(root))
				return []offload.SecondaryTier{t}, err
			},
			Parse:     func(id string, _ []byte) (*offload.ReqContext, error) { return offload.Background(id), nil },
			Admission: tiering.AdmissionConfig{Disabled: true},
		})
		if err != nil {
			b.Fatal(err)
		}
		r, err := svc.Register(context.Background(), l, f)
		if err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		var jobs []Job
		for first := 0; first < blocks; first += perJob {
			j := Job{ID: uint64(first), RequestID: "bench"}
			for i := first; i < first+perJob; i++ {
				j.Keys = append(j.Keys, keyOf(i))
				j.Slots = append(j.Slots, int64(i))
			}
			jobs = append(jobs, j)
		}
		ctx := context.Background()
		if err := r.Submit(ctx, jobs, nil); err != nil {
			b.Fatal(err)
		}
		for n := 0; n < len(jobs); {
			res, err := r.NextResults(ctx)
			if err != nil {
				b.Fatal(err)
			}
			for _, x := range res {
				if !x.Success {
					b.Fatalf("job %d failed", x.JobID)
				}
			}
			n += len(res)
		}
		viaRegion += time.Since(start)
		svc.Close(ctx)
		os.RemoveAll(root)
	}
	runDirect := func() {
		root := filepath.Join(dir, fmt.Sprint("d", round))
		t, err := fs.New(fsConfig(root))
		if err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		n := 0
		for first := 0; first < blocks; first += perJob {
			j := &offload.Job{ID: uint64(first), Arena: m, Req: offload.Background("bench")}
			for i := first; i < first+perJob; i++ {
				j.Keys = append(j.Keys, keyOf(i))
				j.Slots = append(j.Slots, int64(i))
			}
			t.SubmitStore(j)
			n++
		}
		if err := t.DrainJobs(context.Background()); err != nil {
			b.Fatal(err)
		}
		for _, r := range t.FinishedJobs() {
			if !r.Success {
				b.Fatalf("job %d failed: %v", r.JobID, r.Err)
			}
			n--
		}
		if n != 0 {
			b.Fatalf("%d jobs unanswered", n)
		}
		direct += time.Since(start)
		t.Close(context.Background())
		os.RemoveAll(root)
	}
	b.SetBytes(blocks * block)
	for b.Loop() {
		round++
		if round%2 == 1 {
			runRegion()
			runDirect()
		} else {
			runDirect()
			runRegion()
		}
	}
	mbps := func(d time.Duration) float64 { return float64(round*blocks*block) / d.Seconds() / 1e6 }
	b.ReportMetric(mbps(viaRegion), "region-MB/s")
	b.ReportMetric(mbps(direct), "fs-MB/s")
	b.ReportMetric(direct.Seconds()/viaRegion.Seconds(), "region/fs")
}

// BenchmarkRegionNewRequest creates a request (its first lookup), looks
// up one key and finishes it while a region holds 10 000 live requests:
// the request table's bookkeeping must not grow with them (it walked
// every request of the namespace per new request before).
func BenchmarkRegionNewRequest(b *testing.B) {
	for _, live := range []int{0, 10_000} {
		b.Run(fmt.Sprint("live=", live), func(b *testing.B) {
			svc, err := New(Config{
				Tiers: func(context.Context, string, Layout) ([]offload.SecondaryTier, error) {
					m, err := memory.New(memory.Config{Name: "dram", Medium: offload.MediumCPU, Locality: offload.LocalityRemote})
					return []offload.SecondaryTier{m}, err
				},
				Parse:       func(id string, _ []byte) (*offload.ReqContext, error) { return offload.Background(id), nil },
				Admission:   tiering.AdmissionConfig{Disabled: true},
				MaxRequests: live + 16,
			})
			if err != nil {
				b.Fatal(err)
			}
			defer svc.Close(context.Background())
			l := Layout{NumBlocks: 4, RowStride: 4096, BlocksPerChunk: 1, Model: "bench", DType: "float16", WorldSize: 1}
			f, err := os.CreateTemp(b.TempDir(), "region")
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			if err := f.Truncate(l.Size()); err != nil {
				b.Fatal(err)
			}
			r, err := svc.Register(context.Background(), l, f)
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			keys := []offload.Key{offload.MakeKey([]byte("bench-key"), 0)}
			for i := range live {
				if _, err := r.Lookup(ctx, fmt.Sprint("live-", i), nil, keys); err != nil {
					b.Fatal(err)
				}
			}
			b.ResetTimer()
			for i := range b.N {
				id := fmt.Sprint("new-", i)
				if _, err := r.Lookup(ctx, id, nil, keys); err != nil {
					b.Fatal(err)
				}
				if _, err := r.Step(ctx, []string{id}, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
