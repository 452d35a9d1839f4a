package fs

import (
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

func decodeStrict(src string, v any) error {
	dec := yaml.NewDecoder(strings.NewReader(src))
	dec.KnownFields(true)
	return dec.Decode(v)
}

func TestConfigYAML(t *testing.T) {
	var c Config
	err := decodeStrict(`
root_dir: /var/cache/kvtier
locality: LOCAL
read_threads: 4
write_threads: 2
queue_depth: 64
max_bytes: 10GiB
high_watermark: 0.9
low_watermark: 0.8
format: vllm
o_direct: "off"
events: true
namespace:
  model_name: meta-llama/Llama-3.1-8B
  tokens_per_hash: 16
  dtype: torch.bfloat16
  kv_cache_groups:
    - tokens_per_block: 16
      layer_names: [a, b]
  extra_fields: {parallel_agnostic: false}
  rank: 2
  block_bytes: 2097152
`, &c)
	if err != nil {
		t.Fatal(err)
	}
	if c.MaxBytes != 10<<30 || c.Namespace.Rank != 2 || c.Namespace.KVCacheGroups[0].LayerNames[1] != "b" ||
		c.Namespace.Extra["parallel_agnostic"] != false || c.ODirect != "off" || c.Format != "vllm" {
		t.Fatalf("decoded %+v", c)
	}
	s, err := c.settings()
	if err != nil {
		t.Fatal(err)
	}
	if s.high != int64(float64(10<<30)*0.9) || s.direct != directOff || s.format != FormatVLLM || s.readThreads != 4 {
		t.Fatalf("settings %+v", s)
	}
	if err := decodeStrict("root_dir: /x\nmax_bytes: 10 parsecs\n", &Config{}); err == nil || !strings.Contains(err.Error(), "parsecs") {
		t.Fatalf("bad size: %v", err)
	}
	// Sizes follow the rest of the config file: single-letter units are
	// ambiguous there, so they are here too.
	if err := decodeStrict("root_dir: /x\nmax_bytes: 5g\n", &Config{}); err == nil || !strings.Contains(err.Error(), `"5g"`) {
		t.Fatalf("ambiguous unit: %v", err)
	}
	if err := decodeStrict("root_dir: /x\nn_read_threads: 3\n", &Config{}); err == nil {
		t.Fatal("unknown key accepted")
	}
}
