package server_test

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/server"
)

// syncBuffer is a log destination safe for concurrent handlers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (w *syncBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *syncBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// TestMetricSeries scrapes /metrics and requires every series issue 6
// lists: per tier hits, misses, retries, lookups skipped by the filter,
// promotions, cascades (ok, failed, dropped), bytes in and out, job
// latency histograms, occupancy and evictions, health and corrupt
// blocks (issue 7); filter warnings by reason;
// events published and dropped. Lenient-mode warnings are logged once per
// distinct message (offload.WarningLog), however often they recur.
func TestMetricSeries(t *testing.T) {
	logs := &syncBuffer{}
	e := startEnv(t, envOptions{logger: slog.New(slog.NewTextHandler(logs, nil))})
	ctx := ctxT(t)
	c := e.dial(t, e.unix)
	for _, id := range []string{"w1", "w2", "w3"} {
		if _, err := c.NewRequest(ctx, id, `{"kv_load_tiers": [{"medium": "disk"}], "kv_store_tiers": "storage"}`); err != nil {
			t.Fatal(err)
		}
	}
	var blocks []client.Block
	for _, k := range keys(0, 2) {
		blocks = append(blocks, client.Block{Key: k, Data: block(k)})
	}
	if _, err := c.PutBlocks(ctx, blocks, client.CallOptions{}); err != nil {
		t.Fatal(err)
	}
	for pending := true; pending; time.Sleep(time.Millisecond) {
		var err error
		if pending, err = c.ScheduleEnd(ctx, nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	body := scrape(t, e)
	tier := `locality="LOCAL",medium="STORAGE",namespace="",`
	for _, want := range []string{
		`kvtier_tier_lookups_total{` + tier + `result="hit",`,
		`kvtier_tier_lookups_total{` + tier + `result="miss",`,
		`kvtier_tier_lookups_total{` + tier + `result="retry",`,
		`kvtier_tier_lookups_skipped_total{` + tier,
		`kvtier_tier_promotions_total{` + tier + `result="ok",`,
		`kvtier_tier_promotions_total{` + tier + `result="failed",`,
		`kvtier_tier_cascades_total{` + tier + `result="ok",`,
		`kvtier_tier_cascades_total{` + tier + `result="failed",`,
		`kvtier_tier_cascades_total{` + tier + `result="dropped",`,
		`kvtier_tier_cascade_blocks_revoked_total{` + tier,
		`kvtier_tier_bytes_total{direction="in",` + tier,
		`kvtier_tier_bytes_total{direction="out",` + tier,
		`kvtier_tier_job_duration_seconds_bucket{kind="load",` + tier,
		`kvtier_tier_job_duration_seconds_bucket{kind="store",` + tier,
		`kvtier_tier_blocks{` + tier + `tier="local-disk",type="memory"} 2`,
		`kvtier_tier_evictions_total{` + tier,
		`kvtier_tier_healthy{` + tier + `tier="local-disk",type="memory"} 1`,
		`kvtier_tier_corrupt_blocks_total{` + tier + `tier="local-disk",type="memory"} 0`,
		`kvtier_tier_corrupt_blocks_deleted_total{` + tier + `tier="local-disk",type="memory"} 0`,
		`kvtier_primary_evictions_total{namespace=""}`,
		`kvtier_filter_warnings_total{reason="unknown_medium"} 3`,
		`kvtier_filter_warnings_total{reason="not_list"} 3`,
		`kvtier_events_published_total{namespace=""}`,
		`kvtier_events_dropped_total{namespace=""}`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	for _, msg := range []string{`unknown medium \"disk\"`, `kv_store_tiers: expected list`} {
		if n := strings.Count(logs.String(), msg); n != 1 {
			t.Errorf("warning %s logged %d times, want once:\n%s", msg, n, logs.String())
		}
	}
}

// One client at its request cap is refused (and counted); another
// keeps creating requests.
func TestSessionRequestCap(t *testing.T) {
	e := startEnv(t, envOptions{limits: server.Limits{MaxRequests: 100, MaxSessionRequests: 3}})
	ctx := ctxT(t)
	greedy, other := e.dial(t, e.unix), e.dial(t, e.unix)
	for i := range 3 {
		if _, err := greedy.NewRequest(ctx, fmt.Sprint("g", i), ""); err != nil {
			t.Fatal(err)
		}
	}
	_, err := greedy.NewRequest(ctx, "g3", "")
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "max_session_requests") {
		t.Fatalf("a session past its cap: %v, want RESOURCE_EXHAUSTED naming limits.max_session_requests", err)
	}
	for i := range 3 {
		if _, err := other.NewRequest(ctx, fmt.Sprint("o", i), ""); err != nil {
			t.Fatalf("another session at the greedy one's cap: %v", err)
		}
	}
	// A finished request frees its place in the cap.
	if err := greedy.FinishRequest(ctx, "g0"); err != nil {
		t.Fatal(err)
	}
	if _, err := greedy.NewRequest(ctx, "g3", ""); err != nil {
		t.Fatalf("after a finish: %v", err)
	}
	if body := scrape(t, e); !strings.Contains(body, `kvtier_requests_refused_total{namespace="",why="session_cap"} 1`) {
		t.Errorf("metrics lack the refusal:\n%s", body)
	}
}
