package server_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/tiers/memory"
	"github.com/kvtier/kvtier/tiers/redis"
	"github.com/kvtier/kvtier/tiers/remote"
)

// scrape returns the daemon's /metrics page.
func scrape(t *testing.T, e *env) string {
	t.Helper()
	return scrapeURL(t, "http://"+e.srv.MetricsAddr()+"/metrics")
}

// scrapeURL returns the page at url.
func scrapeURL(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(body)
}

// scrapeUntil returns the daemon's /metrics page once cond holds for it,
// or the last page scraped after a bound. The daemon counts a call after it
// has answered it, so a client can hold its answer before the counter moves.
func scrapeUntil(t *testing.T, e *env, cond func(page string) bool) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		m := scrape(t, e)
		if cond(m) || time.Now().After(deadline) {
			return m
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// metricValue returns the value of the series name whose labels include
// every one of labels (`k="v"`), and whether there is one.
func metricValue(body, name string, labels ...string) (float64, bool) {
	for _, line := range strings.Split(body, "\n") {
		rest, ok := strings.CutPrefix(line, name+"{")
		if !ok {
			continue
		}
		ls, val, ok := strings.Cut(rest, "} ")
		if !ok {
			continue
		}
		all := true
		for _, l := range labels {
			all = all && strings.Contains(ls, l)
		}
		if !all {
			continue
		}
		v, err := strconv.ParseFloat(val, 64)
		return v, err == nil
	}
	return 0, false
}

// waitMetric polls /metrics until cond holds for the series, driving the
// daemon with poke between scrapes.
func waitMetric(t *testing.T, e *env, what string, poke func(), cond func(float64) bool, name string, labels ...string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		v, ok := metricValue(scrape(t, e), name, labels...)
		if ok && cond(v) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s{%s} = %v (present %v)", what, name, strings.Join(labels, ","), v, ok)
		}
		if poke != nil {
			poke()
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestTierHealthMetric is issue 7's "a tier whose server is down is
// reported unhealthy in metrics": a redis tier whose server stops goes
// to kvtier_tier_healthy 0 once it notices (a failed cascade), counts the
// cascades it then refuses, and is back to 1 once the server is.
func TestTierHealthMetric(t *testing.T) {
	m := miniredis.RunT(t)
	e := startEnv(t, envOptions{tiers: func(t envT) []offload.SecondaryTier {
		cfg := redis.DefaultConfig()
		cfg.Name = "kv-redis"
		cfg.Addr = m.Addr()
		cfg.Retries = 0
		cfg.UnhealthyAfter = 1
		cfg.ProbeInterval = 10 * time.Millisecond
		cfg.DialTimeout = 200 * time.Millisecond
		cfg.Timeout = 500 * time.Millisecond
		cfg.Logger = slog.New(slog.DiscardHandler)
		tier, err := redis.New(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tier.Close(context.Background()) })
		return []offload.SecondaryTier{tier}
	}})
	ctx := ctxT(t)
	c := e.dial(t, e.unix)
	next := 0
	// cascade puts a fresh block into the primary and lets the manager
	// cascade it to the tier.
	cascade := func() {
		k := key(next)
		next++
		if _, err := c.PutBlocks(ctx, []client.Block{{Key: k, Data: block(k)}}, client.CallOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.ScheduleEnd(ctx, nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	tier := `tier="kv-redis"`
	is := func(want float64) func(float64) bool { return func(v float64) bool { return v == want } }

	cascade()
	waitMetric(t, e, "server up", nil, is(1), "kvtier_tier_healthy", tier, `type="redis"`)
	waitMetric(t, e, "server up", nil, is(0), "kvtier_tier_jobs_skipped_total", tier, `kind="store"`)

	m.Close()
	waitMetric(t, e, "server stopped", cascade, is(0), "kvtier_tier_healthy", tier)
	waitMetric(t, e, "server stopped", cascade, func(v float64) bool { return v > 0 }, "kvtier_tier_jobs_skipped_total", tier, `kind="store"`)

	if err := m.Restart(); err != nil {
		t.Fatal(err)
	}
	waitMetric(t, e, "server restarted", nil, is(1), "kvtier_tier_healthy", tier)
}

// fakeRemote is a memory tier that reports the Stats of a tier built on
// tiers/remote (as s3 does) and has no Healthy method of its own.
type fakeRemote struct {
	*memory.Tier
	mu sync.Mutex
	st remote.Stats
}

func (f *fakeRemote) Report() offload.TierReport {
	f.mu.Lock()
	defer f.mu.Unlock()
	return remote.ReportOf(f.st)
}

func (f *fakeRemote) set(st remote.Stats) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.st = st
}

// TestRemoteStatsMetrics checks that every figure of a remote tier's
// Stats reaches its series, for tiers whose Stats are tiers/remote's.
func TestRemoteStatsMetrics(t *testing.T) {
	mem, err := memory.New(memory.Config{Name: "fake-s3", Medium: offload.MediumStorage, Locality: offload.LocalityRemote})
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeRemote{Tier: mem}
	e := startEnv(t, envOptions{tiers: func(envT) []offload.SecondaryTier { return []offload.SecondaryTier{f} }})
	for _, tc := range []struct {
		st   remote.Stats
		want map[string]float64
	}{
		{remote.Stats{Healthy: true}, map[string]float64{"kvtier_tier_healthy": 1}},
		{
			remote.Stats{Healthy: false, LookupsUnhealthy: 7, LoadJobsSkipped: 3, StoreJobsSkipped: 5, Corrupted: 4, Deleted: 2},
			map[string]float64{
				"kvtier_tier_healthy":                      0,
				"kvtier_tier_lookups_unhealthy_total":      7,
				"kvtier_tier_jobs_skipped_total load":      3,
				"kvtier_tier_jobs_skipped_total store":     5,
				"kvtier_tier_corrupt_blocks_total":         4,
				"kvtier_tier_corrupt_blocks_deleted_total": 2,
			},
		},
	} {
		f.set(tc.st)
		body := scrape(t, e)
		for series, want := range tc.want {
			name, kind, _ := strings.Cut(series, " ")
			labels := []string{`tier="fake-s3"`, `medium="STORAGE"`, `locality="REMOTE"`}
			if kind != "" {
				labels = append(labels, `kind="`+kind+`"`)
			}
			if got, ok := metricValue(body, name, labels...); !ok || got != want {
				t.Errorf("stats %+v: %s = %v (present %v), want %v", tc.st, series, got, ok, want)
			}
		}
	}
}

// The probes a kubelet uses answer on the metrics address: /healthz while
// the process serves, /readyz while the API does.
func TestProbes(t *testing.T) {
	e := startEnv(t, envOptions{slots: 8, tiers: noTiers})
	for _, path := range []string{"/healthz", "/readyz"} {
		if got := scrapeURL(t, "http://"+e.srv.MetricsAddr()+path); got != "ok\n" {
			t.Errorf("%s: %q, want ok", path, got)
		}
	}
}
