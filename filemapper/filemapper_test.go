package filemapper

import (
	"testing"
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
