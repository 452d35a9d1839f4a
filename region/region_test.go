package region

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/tiering"
	"github.com/kvtier/kvtier/tiers/memory"
)

const stride = 4096

func testLayout(blocks int) Layout {
	return Layout{NumBlocks: blocks, RowStride: stride, BlocksPerChunk: 1, TokensPerBlock: 16, TokensPerHash: 16,
		Model: "org/tiny", DType: "float16", WorldSize: 1, TP: 1, PP: 1, PCP: 1, DCP: 1, CPUPageSize: stride}
}

// env is a service whose namespaces each get a storage tier (local) and
// a CPU tier (remote), both in memory; tiers[ns] are the built tiers.
type env struct {
	svc   *Service
	tiers map[string][]*memory.Tier
	mod   func(i int, c *memory.Config)
}

func newEnv(t *testing.T, mod func(i int, c *memory.Config)) *env {
	t.Helper()
	e := &env{tiers: map[string][]*memory.Tier{}, mod: mod}
	svc, err := New(Config{
		Tiers: func(_ context.Context, ns string, _ Layout) ([]offload.SecondaryTier, error) {
			cfgs := []memory.Config{
				{Name: "disk", Medium: offload.MediumStorage, Locality: offload.LocalityLocal, Events: true},
				{Name: "dram", Medium: offload.MediumCPU, Locality: offload.LocalityRemote},
			}
			var out []offload.SecondaryTier
			for i, c := range cfgs {
				if e.mod != nil {
					e.mod(i, &c)
				}
				m, err := memory.New(c)
				if err != nil {
					return nil, err
				}
				e.tiers[ns] = append(e.tiers[ns], m)
				out = append(out, m)
			}
			return out, nil
		},
		Parse: func(id string, params []byte) (*offload.ReqContext, error) {
			var p offload.Parser
			if len(params) == 0 {
				return p.NewReqContext(id, nil)
			}
			return p.NewReqContext(id, params)
		},
		Admission: tiering.AdmissionConfig{Disabled: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	e.svc = svc
	t.Cleanup(func() { svc.Close(context.Background()) })
	return e
}

// regionFile creates a region file of l's size and maps it for the test
// (as vLLM's primary would).
func regionFile(t *testing.T, l Layout) (*os.File, *mapping) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(t.TempDir(), "vllm_offload_test.mmap"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if err := f.Truncate(l.Size()); err != nil {
		t.Fatal(err)
	}
	m, err := mapRegion(f, l)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.unmap() })
	return f, m
}

func (e *env) register(t *testing.T, l Layout) (*Region, *mapping) {
	t.Helper()
	f, m := regionFile(t, l)
	r, err := e.svc.Register(context.Background(), l, f)
	if err != nil {
		t.Fatal(err)
	}
	return r, m
}

func key(i int) offload.Key { return offload.MakeKey([]byte(fmt.Sprintf("block-%04d", i)), 0) }

func fill(m *mapping, slot int64, k offload.Key) []byte {
	b, _ := m.Slot(slot)
	for i := range b {
		b[i] = byte(int(k[len(k)-5]) + i)
	}
	return slices.Clone(b)
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// results collects exactly n results of r.
func results(t *testing.T, r *Region, n int) map[uint64]Result {
	t.Helper()
	out := map[uint64]Result{}
	for len(out) < n {
		rs, err := r.NextResults(ctxT(t))
		if err != nil {
			t.Fatalf("after %d of %d results: %v", len(out), n, err)
		}
		for _, x := range rs {
			if _, dup := out[x.JobID]; dup {
				t.Fatalf("job %d answered twice", x.JobID)
			}
			out[x.JobID] = x
		}
	}
	return out
}

func TestStoreLookupPromoteAcrossEngines(t *testing.T) {
	e := newEnv(t, nil)
	l := testLayout(8)
	r1, m1 := e.register(t, l)
	keys := []offload.Key{key(1), key(2), key(3)}
	var want [][]byte
	for i, k := range keys {
		want = append(want, fill(m1, int64(i), k))
	}
	if err := r1.Submit(ctxT(t), []Job{{ID: 7, RequestID: "a", Keys: keys, Slots: []int64{0, 1, 2}}}, nil); err != nil {
		t.Fatal(err)
	}
	if res := results(t, r1, 1)[7]; !res.Success {
		t.Fatalf("store: %+v", res)
	}
	tiers := e.tiers[r1.Namespace()]
	if tiers[0].Len() != 3 || tiers[1].Len() != 3 {
		t.Fatalf("tiers hold %d and %d blocks, want 3 each", tiers[0].Len(), tiers[1].Len())
	}

	// A second engine of the same layout (another size) sees them.
	l2 := l
	l2.NumBlocks = 4
	r2, m2 := e.register(t, l2)
	if r2.Namespace() != r1.Namespace() {
		t.Fatalf("namespaces %s and %s for layouts differing only in size", r1.Namespace(), r2.Namespace())
	}
	found, err := r2.Lookup(ctxT(t), "b", nil, append(keys, key(9)))
	if err != nil || !slices.Equal(found, []Found{Hit, Hit, Hit, Miss}) {
		t.Fatalf("lookup: %v, %v", found, err)
	}
	if err := r2.Submit(ctxT(t), []Job{{ID: 1, RequestID: "b", Keys: keys, Slots: []int64{3, 1, 2}, Promotion: true}}, nil); err != nil {
		t.Fatal(err)
	}
	if res := results(t, r2, 1)[1]; !res.Success {
		t.Fatalf("promotion: %+v", res)
	}
	for i, s := range []int64{3, 1, 2} {
		if b, _ := m2.Slot(s); !bytes.Equal(b, want[i]) {
			t.Fatalf("slot %d of engine 2 does not hold key %d's bytes", s, i)
		}
	}
	// Events reach both engines, for each to publish.
	for _, r := range []*Region{r1, r2} {
		ev, err := r.Step(ctxT(t), []string{"a", "b"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if r == r1 && (len(ev) != 1 || ev[0].Tier != "disk" || len(ev[0].Keys) != 3) {
			t.Fatalf("engine 1 events %+v, want the disk tier's stored event", ev)
		}
	}
	// Another layout never sees them.
	l3 := l
	l3.DType = "bfloat16"
	r3, _ := e.register(t, l3)
	if r3.Namespace() == r1.Namespace() {
		t.Fatal("layouts of different dtypes share a namespace")
	}
	if found, _ := r3.Lookup(ctxT(t), "c", nil, keys); !slices.Equal(found, []Found{Miss, Miss, Miss}) {
		t.Fatalf("another layout's lookup: %v", found)
	}
}

func TestFiltersAreApplied(t *testing.T) {
	e := newEnv(t, nil)
	r, m := e.register(t, testLayout(8))
	keys := []offload.Key{key(1), key(2)}
	fill(m, 0, keys[0])
	fill(m, 1, keys[1])
	// Store to CPU tiers only: the disk tier gets nothing.
	params := [][]byte{[]byte(`{"kv_store_tiers":[{"medium":"cpu"}]}`)}
	if err := r.Submit(ctxT(t), []Job{{ID: 1, RequestID: "s", Keys: keys, Slots: []int64{0, 1}}}, params); err != nil {
		t.Fatal(err)
	}
	results(t, r, 1)
	tiers := e.tiers[r.Namespace()]
	if tiers[0].Len() != 0 || tiers[1].Len() != 2 {
		t.Fatalf("disk %d, dram %d blocks; want 0 and 2", tiers[0].Len(), tiers[1].Len())
	}
	// kv_store_tiers: [] stores nowhere and is answered at once.
	if err := r.Submit(ctxT(t), []Job{{ID: 2, RequestID: "n", Keys: []offload.Key{key(5)}, Slots: []int64{2}}}, [][]byte{[]byte(`{"kv_store_tiers":[]}`)}); err != nil {
		t.Fatal(err)
	}
	if res := results(t, r, 1)[2]; !res.Success || tiers[0].Contains(key(5)) || tiers[1].Contains(key(5)) {
		t.Fatalf("store to no tier: %+v", res)
	}
	// A load filter that excludes CPU tiers: a miss, and the dram tier is
	// never asked.
	before := e.svc.Stats(ctxT(t))[0].Tiers[1]
	found, err := r.Lookup(ctxT(t), "l", []byte(`{"kv_load_tiers":[{"medium":"storage"}]}`), keys)
	if err != nil || !slices.Equal(found, []Found{Miss, Miss}) {
		t.Fatalf("lookup with storage only: %v %v", found, err)
	}
	after := e.svc.Stats(ctxT(t))[0].Tiers[1]
	if after.Hits+after.Misses+after.Retries != before.Hits+before.Misses+before.Retries || after.SkippedByFilter != before.SkippedByFilter+2 {
		t.Fatalf("the dram tier was asked: before %+v, after %+v", before, after)
	}
}

func TestPartialPromotionAndAsyncLookups(t *testing.T) {
	e := newEnv(t, func(i int, c *memory.Config) { c.AsyncLookup = true })
	r, m := e.register(t, testLayout(8))
	keys := []offload.Key{key(1), key(2), key(3)}
	for i, k := range keys {
		fill(m, int64(i), k)
	}
	if err := r.Submit(ctxT(t), []Job{{ID: 1, RequestID: "s", Keys: keys, Slots: []int64{0, 1, 2}}}, nil); err != nil {
		t.Fatal(err)
	}
	results(t, r, 1)
	// Asynchronous tiers: the lookup waits for them and answers for sure.
	found, err := r.Lookup(ctxT(t), "l", nil, append(keys, key(4)))
	if err != nil || !slices.Equal(found, []Found{Hit, Hit, Hit, Miss}) {
		t.Fatalf("lookup over asynchronous tiers: %v %v", found, err)
	}
	// The block of key 2 disappears from both tiers before the load.
	for _, tier := range e.tiers[r.Namespace()] {
		tier.Remove(key(2))
	}
	if err := r.Submit(ctxT(t), []Job{{ID: 2, RequestID: "l", Keys: keys, Slots: []int64{5, 6, 7}, Promotion: true}}, nil); err != nil {
		t.Fatal(err)
	}
	// The memory tier stops at the first block it lacks: the prefix that
	// arrived is reported.
	res := results(t, r, 1)[2]
	if res.Success || !slices.Equal(res.Loaded, []int{0}) {
		t.Fatalf("partial promotion: %+v", res)
	}
	// The lost key is looked up afresh next time: a miss now.
	if found, _ := r.Lookup(ctxT(t), "l", nil, []offload.Key{key(2)}); found[0] != Miss {
		t.Fatalf("lookup of the lost block: %v", found)
	}
}

func TestCloseWaitsForTransfersAndRefusesAfter(t *testing.T) {
	e := newEnv(t, func(i int, c *memory.Config) { c.Latency = 50 * time.Millisecond })
	r, m := e.register(t, testLayout(4))
	fill(m, 0, key(1))
	if err := r.Submit(ctxT(t), []Job{{ID: 1, RequestID: "s", Keys: []offload.Key{key(1)}, Slots: []int64{0}}}, nil); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	// The job was answered before the region was unmapped.
	if st := e.svc.Stats(ctxT(t))[0]; st.Jobs != 0 || st.Regions != 0 || st.Requests != 0 {
		t.Fatalf("after close: %+v", st)
	}
	if _, err := r.Lookup(ctxT(t), "x", nil, []offload.Key{key(1)}); !errors.Is(err, ErrClosed) {
		t.Fatalf("lookup after close: %v", err)
	}
	if _, err := e.svc.Region(r.ID()); !errors.Is(err, ErrUnknownRegion) {
		t.Fatalf("closed region still registered: %v", err)
	}
}

func TestRegisterRefusesWrongSizes(t *testing.T) {
	e := newEnv(t, nil)
	l := testLayout(8)
	f, _ := regionFile(t, l)
	bigger := l
	bigger.NumBlocks = 9
	if _, err := e.svc.Register(context.Background(), bigger, f); !errors.Is(err, ErrLayout) {
		t.Fatalf("a region smaller than its layout: %v", err)
	}
	bad := l
	bad.RowStride = 1000
	if _, err := e.svc.Register(context.Background(), bad, f); !errors.Is(err, ErrLayout) {
		t.Fatalf("a row stride off the page: %v", err)
	}
	r, _ := e.register(t, l)
	if err := r.Submit(ctxT(t), []Job{{ID: 1, RequestID: "s", Keys: []offload.Key{key(1)}, Slots: []int64{8}}}, nil); !errors.Is(err, ErrLayout) {
		t.Fatalf("a slot outside the region: %v", err)
	}
}

// Residency of a tier-mode namespace (issue 41): each tier's leading run
// for the load filter, nothing promoted or touched, Primary unknown (-1:
// the engine's CPU tier is vLLM's); a namespace no region registered is
// ErrNoNamespace.
func TestResidencyOfATierModeNamespace(t *testing.T) {
	e := newEnv(t, nil)
	r, m := e.register(t, testLayout(8))
	keys := []offload.Key{key(1), key(2), key(3)}
	for i, k := range keys[:2] {
		fill(m, int64(i), k)
	}
	// key(1) and key(2) to both tiers; key(3) nowhere.
	if err := r.Submit(ctxT(t), []Job{{ID: 1, RequestID: "s", Keys: keys[:2], Slots: []int64{0, 1}}}, nil); err != nil {
		t.Fatal(err)
	}
	results(t, r, 1)
	before := e.svc.Stats(ctxT(t))[0]
	res, warnings, err := e.svc.Residency(ctxT(t), r.Namespace(), keys, nil)
	if err != nil || len(warnings) != 0 {
		t.Fatalf("residency: %v %v", err, warnings)
	}
	if res.Primary != -1 || res.Loadable != 2 || len(res.Tiers) != 2 || res.Tiers[0].Run != 2 || res.Tiers[1].Run != 2 {
		t.Fatalf("residency %+v, want primary -1, loadable 2, runs 2 and 2", res)
	}
	// The storage filter leaves the remote CPU tier out.
	res, _, err = e.svc.Residency(ctxT(t), r.Namespace(), keys, []byte(`{"kv_load_tiers":[{"medium":"storage"}]}`))
	if err != nil || res.Tiers[1].Allowed || res.Tiers[1].Run != 0 || res.Loadable != 2 {
		t.Fatalf("residency with storage only: %+v %v", res, err)
	}
	// Nothing was asked of the tiers as a lookup is.
	after := e.svc.Stats(ctxT(t))[0]
	for i := range after.Tiers {
		a, b := after.Tiers[i], before.Tiers[i]
		if a.Hits+a.Misses+a.Retries != b.Hits+b.Misses+b.Retries {
			t.Fatalf("tier %d was looked up: before %+v, after %+v", i, b, a)
		}
	}
	if _, _, err := e.svc.Residency(ctxT(t), "nobody", keys, nil); !errors.Is(err, ErrNoNamespace) {
		t.Fatalf("an unknown namespace: %v", err)
	}
}
