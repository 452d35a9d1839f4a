package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/offload"
)

// The operator's dashboard (deploy/grafana) and alert rules
// (deploy/prometheus) name only series a daemon exports: a daemon with
// every tier type the suite runs (fs, memory, s3, redis, a Redis Cluster,
// a peer) and KV events on serves some traffic, its /metrics is scraped,
// and every kvtier_* name in a dashboard query or a rule expression must be
// a metric family there. The rules are also checked and unit-tested with
// promtool.

var seriesName = regexp.MustCompile(`\bkvtier_[a-z0-9_]+\b`)

// exprsOf collects the strings under the keys "expr" and "query" of a
// decoded JSON or YAML document.
func exprsOf(v any, out *[]string) {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			if s, ok := e.(string); ok && (k == "expr" || k == "query") {
				*out = append(*out, s)
				continue
			}
			exprsOf(e, out)
		}
	case []any:
		for _, e := range x {
			exprsOf(e, out)
		}
	}
}

// namesIn returns the metric families the expressions name (a
// histogram's _bucket, _sum and _count series are its family's).
func namesIn(exprs []string) []string {
	var names []string
	for _, e := range exprs {
		for _, n := range seriesName.FindAllString(e, -1) {
			for _, suf := range []string{"_bucket", "_sum", "_count"} {
				if strings.HasSuffix(n, "_seconds"+suf) {
					n = strings.TrimSuffix(n, suf)
				}
			}
			if !slices.Contains(names, n) {
				names = append(names, n)
			}
		}
	}
	slices.Sort(names)
	return names
}

func deployExprs(t *testing.T) map[string][]string {
	t.Helper()
	root := filepath.Join("..", "..", "deploy")
	out := map[string][]string{}
	for _, f := range []string{"grafana/kvtier.json", "prometheus/kvtier-alerts.yaml"} {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		var doc any
		if strings.HasSuffix(f, ".json") {
			err = json.Unmarshal(b, &doc)
		} else {
			err = yaml.Unmarshal(b, &doc)
		}
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		var exprs []string
		exprsOf(doc, &exprs)
		if len(exprs) == 0 {
			t.Fatalf("%s: no expressions found", f)
		}
		out[f] = exprs
	}
	return out
}

// exportedFamilies scrapes a /metrics endpoint for its metric family names.
func exportedFamilies(t *testing.T, addr string) map[string]bool {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	fams := map[string]bool{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) >= 3 && f[0] == "#" && f[1] == "TYPE" {
			fams[f[2]] = true
		}
	}
	if err := sc.Err(); err != nil && err != io.EOF {
		t.Fatal(err)
	}
	return fams
}

func TestDashboardAndAlertsNameExportedSeries(t *testing.T) {
	ep, ak, sk := os.Getenv("KVTIER_TEST_S3_ENDPOINT"), os.Getenv("KVTIER_TEST_S3_ACCESS_KEY"), os.Getenv("KVTIER_TEST_S3_SECRET_KEY")
	raddr, cluster := os.Getenv("KVTIER_TEST_REDIS_ADDR"), os.Getenv("KVTIER_TEST_REDIS_CLUSTER_ADDRS")
	if ep == "" || raddr == "" || cluster == "" {
		if os.Getenv("KVTIER_REQUIRE_INTEGRATION") == "1" {
			t.Fatal("KVTIER_REQUIRE_INTEGRATION=1 but the S3 and Redis test servers are not set")
		}
		t.Skip("KVTIER_TEST_S3_ENDPOINT, KVTIER_TEST_REDIS_ADDR, KVTIER_TEST_REDIS_CLUSTER_ADDRS not set: run scripts/test.sh")
	}
	exprs := deployExprs(t)

	other := startPeerDaemon(t, "other", "[]")
	d := newPeerDaemon(t, "all-tiers")
	d.metrics = freeTCP(t)
	d.events = fmt.Sprintf("events: {enabled: true, endpoint: \"tcp://%s\", mode: bind}", freeTCP(t))
	id := fmt.Sprint(time.Now().UnixNano())
	seeds, _ := json.Marshal(strings.Split(cluster, ","))
	d.start(t, fmt.Sprintf(`
  - {name: dram, type: memory, medium: cpu, locality: local, capacity_blocks: 64}
  - {name: disk, type: fs, root_dir: %q}
  - {name: fleet, type: peer, peers: [{name: other, addr: %q}]}
  - {name: objects, type: s3, bucket: kvtier-dash-%s, create_bucket: true, endpoint: %q, access_key: %q, secret_key: %q, locality: remote}
  - {name: kv, type: redis, addr: %q, key_prefix: "dash-%s:", locality: remote}
  - {name: kvc, type: redis, cluster: true, addrs: %s, key_prefix: "dashc-%s:", locality: remote}
`, filepath.Join(d.dir, "data"), other.tcp, id, ep, ak, sk, raddr, id, seeds, id))

	// Traffic: stores that cascade everywhere, a load that misses, lookups.
	var blocks []client.Block
	for i := range 8 {
		blocks = append(blocks, client.Block{Key: offload.MakeKey(fmt.Appendf(nil, "dash-%s-%d", id, i), 0), Data: make([]byte, 4096)})
	}
	if _, err := d.c.PutBlocks(ctxFor(t), blocks, client.CallOptions{}); err != nil {
		t.Fatal(err)
	}
	d.get(t, offload.MakeKey([]byte("dash-absent"), 0), "")

	fams := exportedFamilies(t, d.metrics)
	for f, ex := range exprs {
		for _, n := range namesIn(ex) {
			if !fams[n] {
				t.Errorf("%s names %s, which the daemon does not export", f, n)
			}
		}
	}

	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("KVTIER_REQUIRE_INTEGRATION") == "1" {
			t.Fatal("KVTIER_REQUIRE_INTEGRATION=1 but promtool (Debian: prometheus) is not on PATH")
		}
		t.Log("promtool not on PATH: the rules are not checked")
		return
	}
	dir := filepath.Join("..", "..", "deploy", "prometheus")
	for _, args := range [][]string{{"check", "rules", "kvtier-alerts.yaml"}, {"test", "rules", "kvtier-alerts.test.yaml"}} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// The check itself: a renamed series is caught.
func TestDashboardCheckCatchesARename(t *testing.T) {
	names := namesIn([]string{`histogram_quantile(0.9, rate(kvtier_tier_job_duration_seconds_bucket[5m]))`, `kvtier_tier_healthy == 0`})
	if !slices.Equal(names, []string{"kvtier_tier_healthy", "kvtier_tier_job_duration_seconds"}) {
		t.Fatalf("names %v", names)
	}
	exported := map[string]bool{"kvtier_tier_healthy": true, "kvtier_tier_job_duration_seconds": true}
	for _, n := range namesIn([]string{`kvtier_tier_health == 0`}) {
		if exported[n] {
			t.Fatalf("renamed series %s passed", n)
		}
	}
}
