package fs

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvtier/kvtier/offload"
)

// Golden digests computed with Python: hashlib.sha256(json.dumps(fields,
// sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:12].
func TestDigestMatchesPython(t *testing.T) {
	base := Namespace{
		ModelName: "meta-llama/Llama-3.1-8B", TokensPerHash: 16, DType: "torch.bfloat16",
		KVCacheGroups: []KVCacheGroup{{TokensPerBlock: 16, LayerNames: []string{"model.layers.0.self_attn", "model.layers.1.self_attn"}}},
	}
	unicode := base
	unicode.ModelName = "modèle/<x>&\"q\"\u2028\U0001F600"
	unicode.KVCacheGroups = nil
	extra := unicode
	extra.Extra = map[string]any{"parallel_agnostic": false, "x": 1.5}
	for _, tc := range []struct {
		name string
		ns   Namespace
		want string
	}{
		{"plain", base, "b3ab6ffd4561"},
		{"escapes", unicode, "8a561d6dc8d7"},
		{"extra fields", extra, "a0907a01acb9"},
	} {
		got, err := tc.ns.Digest()
		if err != nil || got != tc.want {
			t.Errorf("%s: digest %s (%v), want %s", tc.name, got, err, tc.want)
		}
	}
	b, _ := appendPyJSON(nil, base.Fields())
	const want = `{"blocks_per_file":1,"dcp_size":1,"dtype":"torch.bfloat16","inference_engine":"vllm","kv_cache_groups":[{"layer_names":["model.layers.0.self_attn","model.layers.1.self_attn"],"tokens_per_block":16}],"model_name":"meta-llama/Llama-3.1-8B","pcp_size":1,"pp_size":1,"tokens_per_hash":16,"tp_size":1}`
	if string(b) != want {
		t.Fatalf("canonical JSON\n got %s\nwant %s", b, want)
	}
}

func TestPyFloat(t *testing.T) {
	for f, want := range map[float64]string{1.5: "1.5", 1: "1.0", 1e16: "1e+16", 1e15: "1000000000000000.0", 0.0001: "0.0001", 0.00001: "1e-05", -2.5e-7: "-2.5e-07"} {
		b, err := appendPyFloat(nil, f)
		if err != nil || string(b) != want {
			t.Errorf("%v → %s (%v), want %s", f, b, err, want)
		}
	}
}

func TestLayoutDirsAndConfig(t *testing.T) {
	root := t.TempDir()
	ns := testNamespace()
	ns.Rank = 3
	tier := newTier(t, root, func(c *Config) { c.Namespace = ns })
	d, _ := ns.Digest()
	base := filepath.Join(root, "org_model_"+d)
	if tier.ConfigPath() != filepath.Join(base, "config.json") || tier.lay.rankDir != base+"_r3" {
		t.Fatalf("paths %s %s", tier.ConfigPath(), tier.lay.rankDir)
	}
	b, err := os.ReadFile(tier.ConfigPath())
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if got["model_name"] != "org/model" || got["inference_engine"] != "vllm" || got["tp_size"] != 1.0 {
		t.Fatalf("config.json = %s", b)
	}
	// Byte for byte what vLLM writes (python/tests/test_fs_layout.py
	// compares ConfigJSON with vLLM's own json.dump).
	if want, _ := ns.ConfigJSON(); string(b) != string(want) {
		t.Fatalf("config.json = %q, want %q", b, want)
	}
	// An existing config.json is left as is.
	os.WriteFile(tier.ConfigPath(), []byte("{}"), 0o644)
	tier.Close(t.Context())
	newTier(t, root, func(c *Config) { c.Namespace = ns })
	if b, _ := os.ReadFile(filepath.Join(base, "config.json")); string(b) != "{}" {
		t.Fatal("config.json rewritten")
	}
}

func TestParsePathInvertsPath(t *testing.T) {
	l := layout{rankDir: "/r"}
	for _, key := range []offload.Key{k(1), k(2), offload.MakeKey([]byte{0xab}, 7), offload.MakeKey([]byte{1, 2, 3, 4, 5, 6, 7, 8}, 1<<31)} {
		rel := strings.TrimPrefix(l.path(key), "/r/")
		got, ok := parsePath(rel)
		if !ok || got != key {
			t.Fatalf("parsePath(%s) = %v %v, want %v", rel, got, ok, key)
		}
	}
	for _, bad := range []string{
		"abc/de_g0/abcdef.bin.x", "abc/de_g0/ABCDEF.bin", "abd/de_g0/abcdef.bin", "abc/df_g0/abcdef.bin",
		"abc/de_g01/abcdef.bin", "abc/de_gx/abcdef.bin", "abc/de/abcdef.bin", "x/abc/de_g0/abcdef.bin",
		"abc/de_g0/abcde.bin", "abc/de_g4294967296/abcdef.bin",
	} {
		if _, ok := parsePath(bad); ok {
			t.Errorf("parsePath accepted %s", bad)
		}
	}
}

// FuzzParsePath feeds arbitrary relative paths (the names a restart finds
// in the block directory, which other processes may have written) to
// parsePath: it never panics, and whatever it accepts is a valid key
// whose path is exactly the name it came from.
func FuzzParsePath(f *testing.F) {
	l := layout{rankDir: "/r"}
	for _, key := range []offload.Key{k(1), offload.MakeKey([]byte{0xab}, 7)} {
		f.Add(strings.TrimPrefix(l.path(key), "/r/"))
	}
	for _, s := range []string{"abc/de_g0/abcdef.bin", "../../etc/passwd", "a/_g/.bin", "abc/de_g-1/abcdef.bin", "abc/de_g0/abcdef.bin/x.bin"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, rel string) {
		key, ok := parsePath(rel)
		if !ok {
			return
		}
		if !key.Valid() {
			t.Fatalf("parsePath(%q) accepted invalid key %q", rel, key)
		}
		if got := strings.TrimPrefix(l.path(key), "/r/"); got != filepath.ToSlash(rel) {
			t.Fatalf("parsePath(%q) = %v, whose path is %q", rel, key, got)
		}
	})
}

// vLLM's json.dump(fields, indent=2, sort_keys=True): \uXXXX for non-ASCII,
// no HTML escaping, nested indentation, empty containers inline, no
// trailing newline.
func TestConfigJSONIsPythonsIndentedDump(t *testing.T) {
	f := false
	ns := Namespace{ModelName: "org/modèle<&>", TokensPerHash: 16, DType: "torch.float16", ParallelAgnostic: &f,
		KVCacheGroups: []KVCacheGroup{{TokensPerBlock: 16, LayerNames: []string{"a", "b"}}, {TokensPerBlock: 32}}}
	got, err := ns.ConfigJSON()
	if err != nil {
		t.Fatal(err)
	}
	want := `{
  "blocks_per_file": 1,
  "dcp_size": 1,
  "dtype": "torch.float16",
  "inference_engine": "vllm",
  "kv_cache_groups": [
    {
      "layer_names": [
        "a",
        "b"
      ],
      "tokens_per_block": 16
    },
    {
      "layer_names": [],
      "tokens_per_block": 32
    }
  ],
  "model_name": "org/mod\u00e8le<&>",
  "parallel_agnostic": false,
  "pcp_size": 1,
  "pp_size": 1,
  "tokens_per_hash": 16,
  "tp_size": 1
}`
	if string(got) != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}
