package server_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	kvtierv1 "github.com/kvtier/kvtier/api/kvtier/v1"
	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/region"
	"github.com/kvtier/kvtier/server"
	"github.com/kvtier/kvtier/tiers/memory"
)

// A daemon serving tier mode only (no primary namespace), with one
// in-memory storage tier per region namespace.
func startRegionDaemon(t *testing.T) (sock string, svc *region.Service) {
	t.Helper()
	sock, svc, _ = startRegionDaemonWith(t, server.Config{})
	return sock, svc
}

// startRegionDaemonWith starts a tier-mode daemon (no primary) from cfg,
// whose regions and socket it sets.
func startRegionDaemonWith(t *testing.T, cfg server.Config) (sock string, svc *region.Service, srv *server.Server) {
	t.Helper()
	svc, err := region.New(region.Config{
		Tiers: func(context.Context, string, region.Layout) ([]offload.SecondaryTier, error) {
			m, err := memory.New(memory.Config{Name: "mem", Medium: offload.MediumStorage, Locality: offload.LocalityLocal, Events: true})
			return []offload.SecondaryTier{m}, err
		},
		Parse: func(id string, params []byte) (*offload.ReqContext, error) {
			var p offload.Parser
			if len(params) == 0 {
				return p.NewReqContext(id, nil)
			}
			return p.NewReqContext(id, params)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	dir := shortTempDir(t)
	sock = filepath.Join(dir, "k.sock")
	cfg.Regions, cfg.UnixSocket = svc, sock
	srv, err = server.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Shutdown(context.Background()) })
	return sock, svc, srv
}

// Tier mode's namespaces have no primary on the daemon, but their tiers
// are the daemon's: /metrics has their series as it has an engine
// namespace's.
func TestRegionTiersOnMetrics(t *testing.T) {
	sock, _, srv := startRegionDaemonWith(t, server.Config{MetricsAddr: "127.0.0.1:0"})
	c, err := client.Dial(sock, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := ctxT(t)
	f, _ := regionFile(t, 4*4096)
	r, err := c.RegisterRegion(ctx, layoutJSON{NumBlocks: 4, RowStride: 4096, BlocksPerChunk: 1, Model: "m", DType: "float16", WorldSize: 1}, f)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close(ctx)
	results, err := r.Results(ctx)
	if err != nil {
		t.Fatal(err)
	}
	k := offload.MakeKey([]byte("metrics-block"), 0)
	if err := r.Submit(ctx, []client.RegionJob{{ID: 1, RequestID: "a", Keys: []offload.Key{k}, Slots: []int64{1}}}); err != nil {
		t.Fatal(err)
	}
	if res, err := results.Recv(); err != nil || !res.GetResults()[0].GetSuccess() {
		t.Fatalf("store result %v, %v", res, err)
	}
	if _, err := r.Step(ctx, []string{"a"}); err != nil {
		t.Fatal(err)
	}
	// A lookup (one hit, one miss) and a promotion whose outcome the engine
	// reads after two of its steps.
	if found, err := r.Lookup(ctx, "b", "", []offload.Key{k, offload.MakeKey([]byte("absent-block!"), 0)}); err != nil || len(found) != 2 {
		t.Fatalf("lookup %v, %v", found, err)
	}
	if err := r.Submit(ctx, []client.RegionJob{{ID: 2, RequestID: "b", Keys: []offload.Key{k}, Slots: []int64{2}, Promotion: true}}); err != nil {
		t.Fatal(err)
	}
	if res, err := results.Recv(); err != nil || !res.GetResults()[0].GetSuccess() {
		t.Fatalf("promotion result %v, %v", res, err)
	}
	page := scrapeURL(t, "http://"+srv.MetricsAddr()+"/metrics")
	for _, want := range []string{
		fmt.Sprintf(`kvtier_region_lookup_keys_total{answer="hit",namespace=%q} 1`, r.Namespace),
		fmt.Sprintf(`kvtier_region_lookup_keys_total{answer="miss",namespace=%q} 1`, r.Namespace),
		fmt.Sprintf(`kvtier_region_lookup_keys_total{answer="unknown",namespace=%q} 0`, r.Namespace),
		fmt.Sprintf(`kvtier_region_promotion_steps_bucket{namespace=%q,le="0"} 1`, r.Namespace),
		fmt.Sprintf(`kvtier_region_promotion_steps_count{namespace=%q} 1`, r.Namespace),
	} {
		if !strings.Contains(page, want) {
			t.Fatalf("/metrics lacks %s:\n%s", want, grepLines(page, "kvtier_region_"))
		}
	}
	want := fmt.Sprintf(`kvtier_tier_cascades_total{locality="LOCAL",medium="STORAGE",namespace=%q,result="ok",tier="mem",type="memory"} 1`, r.Namespace)
	if !strings.Contains(page, want) {
		t.Fatalf("/metrics lacks %s:\n%s", want, grepLines(page, "kvtier_tier_cascades_total"))
	}
	if !strings.Contains(page, fmt.Sprintf(`kvtier_sessions{namespace=%q} 1`, r.Namespace)) {
		t.Fatalf("/metrics lacks the region namespace's sessions:\n%s", grepLines(page, "kvtier_sessions"))
	}
}

func grepLines(page, prefix string) string {
	var out []string
	for _, l := range strings.Split(page, "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

type layoutJSON struct {
	NumBlocks      int    `json:"num_blocks"`
	RowStride      int    `json:"row_stride"`
	BlocksPerChunk int    `json:"blocks_per_chunk"`
	Model          string `json:"model"`
	DType          string `json:"dtype"`
	WorldSize      int    `json:"world_size"`
}

func regionFile(t *testing.T, size int64) (*os.File, []byte) {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "vllm_offload_*.mmap")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(mem) })
	return f, mem
}

func TestRegionSocketAndRPCs(t *testing.T) {
	sock, svc := startRegionDaemon(t)
	c, err := client.Dial(sock, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := ctxT(t)
	l := layoutJSON{NumBlocks: 4, RowStride: 4096, BlocksPerChunk: 1, Model: "m", DType: "float16", WorldSize: 1}
	f, mem := regionFile(t, 4*4096)

	// A layout that does not match the file is refused, naming both sizes.
	wrong := l
	wrong.NumBlocks = 5
	if _, err := c.RegisterRegion(ctx, wrong, f); err == nil || !strings.Contains(err.Error(), "the region file is 16384 bytes") {
		t.Fatalf("a region of the wrong size: %v", err)
	}
	r, err := c.RegisterRegion(ctx, l, f)
	if err != nil {
		t.Fatal(err)
	}
	copy(mem[4096:8192], strings.Repeat("k", 4096))
	k := offload.MakeKey([]byte("hash-of-block-1"), 0)
	results, err := r.Results(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Submit(ctx, []client.RegionJob{{ID: 1, RequestID: "a", Keys: []offload.Key{k}, Slots: []int64{1}}}); err != nil {
		t.Fatal(err)
	}
	res, err := results.Recv()
	if err != nil || len(res.GetResults()) != 1 || !res.GetResults()[0].GetSuccess() {
		t.Fatalf("store result %v, %v", res, err)
	}
	found, err := r.Lookup(ctx, "b", `{"kv_load_tiers":[{"medium":"storage"}]}`, []offload.Key{k, offload.MakeKey([]byte("hash-of-block-2"), 0)})
	if err != nil || found[0] != kvtierv1.RegionFound_REGION_FOUND_HIT || found[1] != kvtierv1.RegionFound_REGION_FOUND_MISS {
		t.Fatalf("lookup %v, %v", found, err)
	}
	// The same lookups, many requests in one call, answer the same; each
	// request keeps its own filter.
	many, errs, err := r.LookupMany(ctx, []client.RegionLookup{
		{RequestID: "m1", Keys: []offload.Key{k, offload.MakeKey([]byte("hash-of-block-2"), 0)}},
		{RequestID: "m2", Params: `{"kv_load_tiers":[]}`, Keys: []offload.Key{k}},
	})
	if err != nil || len(many) != 2 || errs[0] != nil || errs[1] != nil {
		t.Fatalf("lookups %v, %v, %v", many, errs, err)
	}
	if many[0][0] != kvtierv1.RegionFound_REGION_FOUND_HIT || many[0][1] != kvtierv1.RegionFound_REGION_FOUND_MISS || many[1][0] != kvtierv1.RegionFound_REGION_FOUND_MISS {
		t.Fatalf("lookups answered %v", many)
	}
	if err := r.Submit(ctx, []client.RegionJob{{ID: 2, RequestID: "b", Keys: []offload.Key{k}, Slots: []int64{3}, Promotion: true}}); err != nil {
		t.Fatal(err)
	}
	if res, err := results.Recv(); err != nil || !res.GetResults()[0].GetSuccess() {
		t.Fatalf("promotion result %v, %v", res, err)
	}
	if string(mem[3*4096:4*4096]) != strings.Repeat("k", 4096) {
		t.Fatal("the promotion did not write the stored bytes into the region")
	}
	ev, err := r.Step(ctx, []string{"a", "b", "m1", "m2"})
	if err != nil || len(ev) != 1 || ev[0].GetMedium() != kvtierv1.Medium_MEDIUM_STORAGE {
		t.Fatalf("step events %v, %v", ev, err)
	}
	st, err := c.WithNamespace(r.Namespace).Stats(ctx)
	if err != nil || len(st.GetTiers()) != 1 || st.GetTiers()[0].GetHits() != 2 { // b's and m1's
		t.Fatalf("stats of the region namespace: %v, %v", st, err)
	}
	// Closing the registration releases the region.
	if err := r.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if st := svc.Stats(ctx); len(st) != 1 || st[0].Regions != 0 {
		t.Fatalf("after close: %+v", st)
	}
	if _, err := r.Lookup(ctx, "c", "", []offload.Key{k}); err == nil {
		t.Fatal("a closed region still answers")
	}
}
