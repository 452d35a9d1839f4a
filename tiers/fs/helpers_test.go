package fs

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvtier/kvtier/filemapper"
	"github.com/kvtier/kvtier/offload"
)

// testArena is an offload.Arena over one []byte.
type testArena struct {
	buf  []byte
	size int
	n    int
}

// newArena returns n slots of size bytes; aligned puts slot 0 on a page
// boundary (so O_DIRECT can use slots in place when size is a multiple
// of the page), otherwise the slots are deliberately misaligned.
func newArena(size, n int, aligned bool) *testArena {
	var buf []byte
	if aligned {
		buf = alignedBuf(size * n)
	} else {
		buf = alignedBuf(size*n + 1)[1:]
	}
	return &testArena{buf: buf, size: size, n: n}
}

func (a *testArena) SlotSize() int { return a.size }
func (a *testArena) NumSlots() int { return a.n }
func (a *testArena) Slot(i int64) ([]byte, error) {
	if i < 0 || i >= int64(a.n) {
		return nil, fmt.Errorf("slot %d of %d: %w", i, a.n, offload.ErrSlotOutOfRange)
	}
	return a.buf[int(i)*a.size : int(i+1)*a.size : int(i+1)*a.size], nil
}

// fill writes a pattern derived from seed into slot i.
func (a *testArena) fill(i int64, seed uint64) {
	b, _ := a.Slot(i)
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for j := range b {
		b[j] = byte(r.Uint32())
	}
}

func (a *testArena) slot(i int64) []byte { b, _ := a.Slot(i); return b }

// k builds a 32-byte-hash key like vLLM's.
func k(n int) offload.Key {
	h := make([]byte, 32)
	h[0], h[1], h[31] = byte(n>>8), byte(n), 0xab
	return offload.MakeKey(h, uint32(n%3))
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func testNamespace() filemapper.Namespace {
	return filemapper.Namespace{ModelName: "org/model", TokensPerHash: 16, DType: "torch.float16",
		KVCacheGroups: []filemapper.KVCacheGroup{{TokensPerBlock: 16, LayerNames: []string{"l0"}}}}
}

// newTier opens a tier on dir with small pools; mod adjusts the config.
func newTier(t *testing.T, dir string, mod func(*Config)) *Tier {
	t.Helper()
	tier, err := New(testConfig(dir, mod))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tier.Close(context.Background()) })
	return tier
}

func testConfig(dir string, mod func(*Config)) Config {
	cfg := Config{Name: "fs0", RootDir: dir, Locality: "local", ReadThreads: 2, WriteThreads: 2,
		Namespace: testNamespace(), Logger: quiet()}
	if mod != nil {
		mod(&cfg)
	}
	return cfg
}

var jobIDs uint64

// run submits one job and waits for its result.
func run(t *testing.T, tier *Tier, promotion bool, a offload.Arena, req *offload.ReqContext, keys []offload.Key, slots []int64) offload.JobResult {
	t.Helper()
	jobIDs++
	job := &offload.Job{ID: jobIDs, Keys: keys, Slots: slots, Promotion: promotion, Req: req, Arena: a}
	if promotion {
		tier.SubmitLoad(job)
	} else {
		tier.SubmitStore(job)
	}
	res := collect(t, tier, 1)
	if res[0].JobID != job.ID {
		t.Fatalf("result for job %d, want %d", res[0].JobID, job.ID)
	}
	return res[0]
}

// collect drains the tier and returns exactly n results.
func collect(t *testing.T, tier *Tier, n int) []offload.JobResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tier.DrainJobs(ctx); err != nil {
		t.Fatal(err)
	}
	res := tier.FinishedJobs()
	if len(res) != n {
		t.Fatalf("%d results, want %d: %+v", len(res), n, res)
	}
	return res
}

// lookupAll looks keys up for req, ends the step and waits for the
// verdicts, then looks up again; it returns the second answers.
func lookupAll(t *testing.T, tier *Tier, req *offload.ReqContext, keys ...offload.Key) []offload.LookupResult {
	t.Helper()
	for _, key := range keys {
		tier.Lookup(key, req)
	}
	step(t, tier)
	out := make([]offload.LookupResult, len(keys))
	for i, key := range keys {
		out[i] = tier.Lookup(key, req)
	}
	return out
}

// step ends an engine step and waits for the flushed checks.
func step(t *testing.T, tier *Tier) {
	t.Helper()
	tier.OnScheduleEnd(offload.ScheduleEnd{})
	deadline := time.Now().Add(10 * time.Second)
	for tier.lookups.Pending() {
		if time.Now().After(deadline) {
			t.Fatal("lookups pending after 10s")
		}
		time.Sleep(200 * time.Microsecond)
	}
}

func req(id string) *offload.ReqContext { return offload.Background(id) }

// await polls FinishedJobs until the results of ids arrive (without
// draining, so other jobs may stay blocked); extra results are returned
// too.
func await(t *testing.T, tier *Tier, ids ...uint64) map[uint64]offload.JobResult {
	t.Helper()
	got := map[uint64]offload.JobResult{}
	deadline := time.Now().Add(10 * time.Second)
	for {
		for _, r := range tier.FinishedJobs() {
			if _, dup := got[r.JobID]; dup {
				t.Fatalf("job %d answered twice", r.JobID)
			}
			got[r.JobID] = r
		}
		done := true
		for _, id := range ids {
			if _, ok := got[id]; !ok {
				done = false
			}
		}
		if done {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("jobs %v not answered after 10s (have %v)", ids, got)
		}
		time.Sleep(200 * time.Microsecond)
	}
}

// storeAsync submits a one-key store without waiting.
func storeAsync(tier *Tier, id uint64, a offload.Arena, key offload.Key, slot int64) {
	tier.SubmitStore(&offload.Job{ID: id, Keys: []offload.Key{key}, Slots: []int64{slot}, Arena: a})
}
