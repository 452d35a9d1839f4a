//go:build charts

package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestPlotServing(t *testing.T) {
	dir := t.TempDir()
	in := `{"runs":[
	  {"label":"no offload","workload":"mooncake","ttft_s":[0.5,0.7],"prompt_tokens":1000,"hit_tokens":{"device":100}},
	  {"label":"lmcache","workload":"mooncake","error":"did not start"},
	  {"label":"kvtier manager","workload":"mooncake","ttft_s":[0.2,0.3],"prompt_tokens":1000,"hit_tokens":{"device":100,"kvtier":300}},
	  {"label":"kvtier manager","workload":"document","ttft_s":[0.1],"prompt_tokens":10,"hit_tokens":{}}]}`
	names, err := plotServing(strings.NewReader(in), dir)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"ttft-mooncake.png", "hits-mooncake.png", "ttft-document.png", "hits-document.png"}
	if len(names) != len(want) {
		t.Fatalf("wrote %v, want %v", names, want)
	}
	for i, n := range names {
		if filepath.Base(n) != want[i] {
			t.Errorf("file %d: %s, want %s", i, n, want[i])
		}
		if st, err := os.Stat(n); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v", n, err)
		}
	}
}

func TestPlotServingRejectsBadInput(t *testing.T) {
	for name, in := range map[string]string{
		"not json":     `{"runs":`,
		"no good runs": `{"runs":[{"label":"x","workload":"w","error":"boom"}]}`,
	} {
		if _, err := plotServing(strings.NewReader(in), t.TempDir()); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}
