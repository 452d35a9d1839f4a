package main

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// benchTrace: request 2 hits A's 3 blocks, request 4 hits 2 of them; 5 of
// 10 blocks in all.
const benchTrace = `{"timestamp": 0, "input_length": 1500, "output_length": 10, "hash_ids": [1, 2, 3]}
{"timestamp": 5, "input_length": 2000, "output_length": 10, "hash_ids": [1, 2, 3, 4]}
{"timestamp": 9, "input_length": 400, "output_length": 10, "hash_ids": [9]}
{"timestamp": 12, "input_length": 1000, "output_length": 10, "hash_ids": [1, 2]}
`

// evictTrace: A, then eight fillers of 3 distinct blocks that push A out
// of a 16-block primary, then A again.
func evictTrace() string {
	var b strings.Builder
	b.WriteString(`{"hash_ids": [1, 2, 3]}` + "\n")
	for i := range 8 {
		id := 100 + 10*i
		fmt.Fprintf(&b, `{"hash_ids": [%d, %d, %d]}`+"\n", id, id+1, id+2)
	}
	b.WriteString(`{"hash_ids": [1, 2, 3]}` + "\n")
	return b.String()
}

const benchTiers = `
secondary_tiers:
  - name: slow-disk
    type: memory
    medium: storage
    locality: local
`

type benchOut struct {
	Trace             string          `json:"trace"`
	Params            json.RawMessage `json:"params"`
	Requests          int             `json:"requests"`
	Blocks            int             `json:"blocks"`
	HitBlocks         int             `json:"hit_blocks"`
	PrimaryHitBlocks  int             `json:"primary_hit_blocks"`
	PromotedHitBlocks int             `json:"promoted_hit_blocks"`
	HitRate           float64         `json:"hit_rate"`
	NsPerKey          float64         `json:"ns_per_key"`
	Primary           struct {
		Blocks     int    `json:"blocks"`
		BlockBytes int    `json:"block_bytes"`
		Policy     string `json:"policy"`
		Evictions  int    `json:"evictions"`
	} `json:"primary"`
	Tiers []struct {
		Name            string `json:"name"`
		HitBlocks       int    `json:"hit_blocks"`
		SkippedByFilter int    `json:"skipped_by_filter"`
		CascadedBlocks  int    `json:"cascaded_blocks"`
	} `json:"tiers"`
	Reference struct {
		CapacityBlocks int     `json:"capacity_blocks"`
		LRUHitRate     float64 `json:"lru_hit_rate"`
		MaxHitRate     float64 `json:"max_hit_rate"`
	} `json:"reference"`
}

func benchJSONRun(t *testing.T, stdin string, args ...string) benchOut {
	t.Helper()
	code, stdout, stderr := runCLI(t, stdin, append([]string{"bench", "--json"}, args...)...)
	if code != 0 {
		t.Fatalf("exit %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}
	var out benchOut
	if err := json.Unmarshal([]byte(stdout), &out); err != nil {
		t.Fatalf("output is not one JSON object: %v\n%s", err, stdout)
	}
	return out
}

func TestBenchText(t *testing.T) {
	trace := writeFile(t, "trace.jsonl", benchTrace)
	code, stdout, stderr := runCLI(t, "", "bench", "--trace", trace, "--primary-blocks", "8", "--block-bytes", "64")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, re := range []string{
		`trace .*trace.jsonl: 4 requests, 10 blocks of 512 tokens`,
		`primary: 8 blocks of 64B?, lru`,
		`secondary tiers: none`,
		`params: none`,
		`prefix hit rate +0\.5000 +5 of 10 blocks`,
		`from primary +0\.5000 +5 blocks`,
		`reference: plain LRU of 8 blocks +0\.5000`,
		`reference: unbounded \(maximum\) +0\.5000`,
		`primary: 0 evictions, 5 blocks stored, 5 held`,
		`throughput: \d+ requests/s, \d+ ns per key \(4 requests in`,
	} {
		if !regexp.MustCompile(re).MatchString(stdout) {
			t.Errorf("output does not match %q:\n%s", re, stdout)
		}
	}
}

func TestBenchTiersText(t *testing.T) {
	trace := writeFile(t, "trace.jsonl", evictTrace())
	cfg := writeFile(t, "tiers.yaml", benchTiers)
	code, stdout, stderr := runCLI(t, "", "bench", "--trace", trace, "--config", cfg, "--primary-blocks", "16", "--block-bytes", "64")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, re := range []string{
		`secondary tiers \(config .*tiers.yaml\): slow-disk \(memory, STORAGE/LOCAL\)`,
		`promoted from slow-disk +0\.1000 +3 blocks`,
		`slow-disk +3 +0 +3 +0 +27 +0 +9 +0 +0 +0 +0 +27`,
	} {
		if !regexp.MustCompile(re).MatchString(stdout) {
			t.Errorf("output does not match %q:\n%s", re, stdout)
		}
	}
}

func TestBenchJSON(t *testing.T) {
	trace := writeFile(t, "trace.jsonl", evictTrace())
	cfg := writeFile(t, "tiers.yaml", benchTiers)
	common := []string{"--trace", trace, "--config", cfg, "--primary-blocks", "16", "--block-bytes", "1KiB"}

	out := benchJSONRun(t, "", common...)
	if out.Requests != 10 || out.Blocks != 30 || out.HitBlocks != 3 || out.PromotedHitBlocks != 3 || out.PrimaryHitBlocks != 0 {
		t.Errorf("default filters: %+v, want A's 3 blocks promoted", out)
	}
	if len(out.Tiers) != 1 || out.Tiers[0].Name != "slow-disk" || out.Tiers[0].HitBlocks != 3 || out.Tiers[0].CascadedBlocks != 27 {
		t.Errorf("tiers %+v", out.Tiers)
	}
	if out.Primary.Blocks != 16 || out.Primary.BlockBytes != 1024 || out.Primary.Policy != "lru" || out.Primary.Evictions == 0 {
		t.Errorf("primary %+v", out.Primary)
	}
	if out.Reference.CapacityBlocks != 16 || out.Reference.LRUHitRate != 0 || out.Reference.MaxHitRate != 0.1 {
		t.Errorf("reference %+v, want LRU 0 and maximum 0.1", out.Reference)
	}
	if string(out.Params) != "null" || out.HitRate != 0.1 || out.NsPerKey <= 0 {
		t.Errorf("params %s, hit rate %v, ns per key %v", out.Params, out.HitRate, out.NsPerKey)
	}

	// The comparison --params exists for: no loads from secondary tiers,
	// so A misses and is stored (and cascaded) again.
	out = benchJSONRun(t, "", append(common, "--params", `{"kv_load_tiers": []}`)...)
	if out.HitBlocks != 0 || out.Tiers[0].SkippedByFilter == 0 || out.Tiers[0].CascadedBlocks != 30 {
		t.Errorf("kv_load_tiers []: %+v", out)
	}
	if string(out.Params) != `{"kv_load_tiers":[]}` {
		t.Errorf("params echoed as %s", out.Params)
	}

	// Params from stdin, ARC, a limit.
	out = benchJSONRun(t, `{"kv_store_tiers": []}`, append(common, "--params", "-", "--policy", "ARC", "--limit", "4")...)
	if out.Requests != 4 || out.Primary.Policy != "arc" || out.Tiers[0].CascadedBlocks != 0 {
		t.Errorf("stdin params, arc, limit 4: %+v", out)
	}
}

func TestBenchTraceSources(t *testing.T) {
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write([]byte(benchTrace))
	zw.Close()
	path := filepath.Join(t.TempDir(), "trace.jsonl.gz")
	if err := os.WriteFile(path, gz.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	if out := benchJSONRun(t, "", "--trace", path, "--primary-blocks", "8"); out.HitBlocks != 5 || out.Blocks != 10 {
		t.Errorf("gzip trace: %+v", out)
	}
	if out := benchJSONRun(t, benchTrace, "--trace", "-", "--primary-blocks", "8"); out.HitBlocks != 5 || out.Trace != "-" {
		t.Errorf("stdin trace: %+v", out)
	}
}

func TestBenchErrors(t *testing.T) {
	trace := writeFile(t, "trace.jsonl", benchTrace)
	bad := writeFile(t, "bad.jsonl", `{"hash_ids": [1]}`+"\n"+`{"hash_ids": [1, "two"]}`+"\n")
	empty := writeFile(t, "empty.jsonl", "\n")
	strict := writeFile(t, "strict.yaml", benchTiers+"validation: strict\n")
	badCfg := writeFile(t, "bad.yaml", "secondary_tiers:\n  - {name: x, type: tape}\n")
	tests := []struct {
		name   string
		stdin  string
		args   []string
		substr string
	}{
		{"no trace", "", nil, `"trace" not set`},
		{"missing file", "", []string{"--trace", filepath.Join(t.TempDir(), "nope.jsonl")}, "no such file"},
		{"bad line", "", []string{"--trace", bad}, "trace line 2"},
		{"empty trace", "", []string{"--trace", empty}, "no requests"},
		{"bad policy", "", []string{"--trace", trace, "--policy", "fifo"}, `--policy "fifo"`},
		{"bad block bytes", "", []string{"--trace", trace, "--block-bytes", "lots"}, "--block-bytes"},
		{"zero primary", "", []string{"--trace", trace, "--primary-blocks", "0"}, "--primary-blocks 0"},
		{"negative limit", "", []string{"--trace", trace, "--limit", "-1"}, "--limit -1"},
		{"stdin twice", "", []string{"--trace", "-", "--params", "-"}, "cannot both read stdin"},
		{"params not an object", "", []string{"--trace", trace, "--params", "[1]"}, "params"},
		{"strict rejects", "", []string{"--trace", trace, "--config", strict, "--params", `{"kv_load_tiers": [{"medium": "tape"}]}`}, "tape"},
		{"bad config", "", []string{"--trace", trace, "--config", badCfg}, "tape"},
		{"fleet timed", "", []string{"--trace", trace, "--nodes", "2", "--timed"}, "drop --timed"},
		{"fleet bad routing", "", []string{"--trace", trace, "--nodes", "2", "--routing", "sticky"}, `routing "sticky"`},
		{"fleet sweep", "", []string{"--trace", trace, "--nodes", "2", "--plot", "x.png", "--plot-sizes", "4"}, "--plot-sizes"},
		{"fleet too many", "", []string{"--trace", trace, "--nodes", "100"}, "100 nodes"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runCLI(t, tc.stdin, append([]string{"bench"}, tc.args...)...)
			if code != 1 || !strings.Contains(stderr, tc.substr) {
				t.Errorf("exit %d, stderr %q; want 1 and a message with %q (stdout %q)", code, stderr, tc.substr, stdout)
			}
			if tc.name == "no trace" {
				return // cobra rejects the flags before --json is read
			}
			code, stdout, _ = runCLI(t, tc.stdin, append([]string{"bench", "--json"}, tc.args...)...)
			var e map[string]string
			if code != 1 || json.Unmarshal([]byte(stdout), &e) != nil || !strings.Contains(e["error"], tc.substr) {
				t.Errorf("--json: exit %d, stdout %q; want 1 and {\"error\": ...%s...}", code, stdout, tc.substr)
			}
		})
	}
}

// A fleet replay reports one row per routing policy, split by source, and
// the same figures twice for the same seed.
func TestBenchFleet(t *testing.T) {
	trace := writeFile(t, "trace.jsonl", evictTrace())
	args := []string{"bench", "--trace", trace, "--primary-blocks", "16", "--block-bytes", "64", "--nodes", "2",
		"--routing", "round-robin,random,prefix-aware", "--peers", "--shared-blocks", "8"}
	code, stdout, stderr := runCLI(t, "", args...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, re := range []string{
		`10 requests on 2 nodes of 16 primary blocks, peer tiers, a shared store of 8 blocks`,
		`routing +hit rate +own DRAM +own disk +own other +peer +shared`,
		`round-robin \+peers \+shared +0\.\d{4}`,
		`prefix-aware \+peers \+shared +0\.\d{4}`,
		`random \+peers \+shared, requests per node: \d+ \d+`,
	} {
		if !regexp.MustCompile(re).MatchString(stdout) {
			t.Errorf("output does not match %q:\n%s", re, stdout)
		}
	}
	code, a, _ := runCLI(t, "", append(args, "--json", "--seed", "3")...)
	_, b, _ := runCLI(t, "", append(args, "--json", "--seed", "3")...)
	var ra, rb struct {
		Fleets []struct {
			HitBlocks int             `json:"hit_blocks"`
			Split     json.RawMessage `json:"split"`
		} `json:"fleets"`
	}
	if code != 0 || json.Unmarshal([]byte(a), &ra) != nil || json.Unmarshal([]byte(b), &rb) != nil || len(ra.Fleets) != 3 {
		t.Fatalf("json: exit %d\n%s", code, a)
	}
	for i := range ra.Fleets {
		if ra.Fleets[i].HitBlocks != rb.Fleets[i].HitBlocks || string(ra.Fleets[i].Split) != string(rb.Fleets[i].Split) {
			t.Errorf("fleet %d differs between two runs with the same seed", i)
		}
	}
	// Round-robin alternates A's two visits over the nodes; with peers,
	// the second visit hits in the other node's DRAM.
	if !strings.Contains(a, `"peer": 3`) {
		t.Errorf("no peer hits for the revisit:\n%s", a)
	}
}
