package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kvtier/kvtier/config"
	"github.com/kvtier/kvtier/filemapper"
	"github.com/kvtier/kvtier/tiers/fs"
	"github.com/kvtier/kvtier/tierset"
)

func newFSLayoutCmd() *cobra.Command {
	var (
		configPath, tierName, root, format, agnostic string
		ns                                           filemapper.Namespace
		groups                                       []string
		layers, blockSize                            int
		asJSON                                       bool
	)
	cmd := &cobra.Command{
		Use:   "fs-layout (--config FILE [--tier NAME] | --model NAME --dtype DTYPE --tokens-per-hash N [flags])",
		Short: "Print the directory an fs tier (or vLLM's fs tier) uses for a namespace",
		Long: `fs-layout prints where the blocks of a namespace live: the namespace
directory <root>/<model>_<digest> with its config.json, the block directory
<...>_r<rank>, the digest, and the exact config.json vLLM writes there.

With --config it shows each fs tier of a daemon's configuration. Otherwise
the flags are vLLM FileMapper's fields, so that an fs tier in format vllm can
be pointed at the directory vLLM itself uses:

  --tokens-per-hash   vLLM's hash block size (the scheduler's block_size)
  --blocks-per-file   the offloaded chunk in GPU blocks (vLLM's fs tier uses
                      blocks_per_chunk: offloaded block_size / GPU block_size)
  --dtype             the KV cache dtype (the model's dtype when
                      cache_dtype is auto) as vLLM records it: vLLM 0.33
                      writes "bfloat16", older releases "torch.bfloat16"
  --group             a KV cache group: TOKENS_PER_BLOCK:LAYER,LAYER,...
                      (repeat per group); --layers N is the shorthand for one
                      group of Llama-style names model.layers.<i>.self_attn.attn
  --parallel-agnostic vLLM's fs tier asks for it and gets it when the model's
                      blocks do not depend on the parallel layout (one
                      full-attention, non-MLA group with head-sharded pages):
                      true (tp/pp/pcp/dcp 1, rank 0) or false (adds
                      "parallel_agnostic": false); unset keeps the sizes
                      without the field, which equals true at tp 1, rank 0
  --replicated-layout MLA under tensor parallelism

The matching fs tier config uses the same names under namespace: (the output
ends with it).`,
		Example: `  kvtier fs-layout --config kvtier.yaml
  kvtier fs-layout --root /mnt/kv --model Qwen/Qwen3-0.6B --dtype bfloat16 \
      --tokens-per-hash 16 --blocks-per-file 4 --layers 28 --block-size 16 \
      --parallel-agnostic true`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			w := cmd.OutOrStdout()
			f, err := fs.ParseFormat(format)
			if err != nil {
				return fmt.Errorf("fs-layout: --format: %w", err)
			}
			if configPath != "" {
				return fsLayoutOfConfig(w, configPath, tierName, asJSON)
			}
			if tierName != "" {
				return errors.New("fs-layout: --tier needs --config")
			}
			if ns.ModelName == "" || ns.DType == "" || ns.TokensPerHash <= 0 {
				return errors.New("fs-layout: --model, --dtype and --tokens-per-hash are required (or --config)")
			}
			switch agnostic {
			case "":
			case "true", "false":
				v := agnostic == "true"
				ns.ParallelAgnostic = &v
			default:
				return fmt.Errorf("fs-layout: --parallel-agnostic %q: want true or false", agnostic)
			}
			for _, g := range groups {
				kg, err := parseGroup(g)
				if err != nil {
					return fmt.Errorf("fs-layout: --group %q: %w", g, err)
				}
				ns.KVCacheGroups = append(ns.KVCacheGroups, kg)
			}
			if layers > 0 {
				if blockSize <= 0 {
					return errors.New("fs-layout: --layers needs --block-size > 0")
				}
				g := filemapper.KVCacheGroup{TokensPerBlock: blockSize}
				for i := range layers {
					g.LayerNames = append(g.LayerNames, "model.layers."+strconv.Itoa(i)+".self_attn.attn")
				}
				ns.KVCacheGroups = append(ns.KVCacheGroups, g)
			}
			l, err := describeLayout(root, ns, f)
			if err != nil {
				return fmt.Errorf("fs-layout: %w", err)
			}
			return l.print(w, asJSON)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&configPath, "config", "", "a daemon configuration: show its fs tiers")
	fl.StringVar(&tierName, "tier", "", "with --config: only this fs tier")
	fl.StringVar(&root, "root", ".", "the tier's root_dir (vLLM's root_dir)")
	fl.StringVar(&format, "format", "vllm", "block format: vllm or kvtier (kvtier adds _b<bytes> with --block-bytes)")
	fl.StringVar(&ns.ModelName, "model", "", "model name as vLLM reports it (e.g. Qwen/Qwen3-0.6B)")
	fl.StringVar(&ns.DType, "dtype", "", "KV cache dtype (bfloat16, float16, fp8, ...)")
	fl.IntVar(&ns.TokensPerHash, "tokens-per-hash", 0, "tokens per hash block")
	fl.IntVar(&ns.BlocksPerFile, "blocks-per-file", 1, "GPU blocks per file")
	fl.IntVar(&ns.TPSize, "tp", 1, "tensor parallel size")
	fl.IntVar(&ns.PPSize, "pp", 1, "pipeline parallel size")
	fl.IntVar(&ns.PCPSize, "pcp", 1, "prefill context parallel size")
	fl.IntVar(&ns.DCPSize, "dcp", 1, "decode context parallel size")
	fl.IntVar(&ns.Rank, "rank", 0, "worker rank")
	fl.IntVar(&ns.BlockBytes, "block-bytes", 0, "block size in bytes (format kvtier only)")
	fl.StringVar(&ns.InferenceEngine, "inference-engine", "vllm", "inference engine name in the digest")
	fl.StringVar(&agnostic, "parallel-agnostic", "", "true, false or unset (see above)")
	fl.BoolVar(&ns.ReplicatedLayout, "replicated-layout", false, "replicated layout (MLA under TP)")
	fl.StringVar(&ns.CanonicalFormat, "canonical-format", "", "vLLM's canonical format id (canonical_layout)")
	fl.StringArrayVar(&groups, "group", nil, "KV cache group TOKENS_PER_BLOCK:LAYER,LAYER,... (repeatable)")
	fl.IntVar(&layers, "layers", 0, "one group of N Llama-style layer names")
	fl.IntVar(&blockSize, "block-size", 16, "GPU block size in tokens for --layers")
	fl.BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func parseGroup(s string) (filemapper.KVCacheGroup, error) {
	tok, names, ok := strings.Cut(s, ":")
	n, err := strconv.Atoi(tok)
	if !ok || err != nil || n <= 0 || names == "" {
		return filemapper.KVCacheGroup{}, errors.New("want TOKENS_PER_BLOCK:LAYER[,LAYER]")
	}
	return filemapper.KVCacheGroup{TokensPerBlock: n, LayerNames: strings.Split(names, ",")}, nil
}

// fsLayout is what fs-layout prints for one namespace.
type fsLayout struct {
	Tier       string         `json:"tier,omitempty"`
	Directory  string         `json:"directory"`
	Blocks     string         `json:"blocks"`
	Digest     string         `json:"digest"`
	Fields     map[string]any `json:"fields"`
	ConfigJSON string         `json:"config_json"`
	ns         filemapper.Namespace
}

func describeLayout(root string, ns filemapper.Namespace, f fs.Format) (fsLayout, error) {
	base, blocks, err := fs.Dirs(ns, root, f)
	if err != nil {
		return fsLayout{}, err
	}
	digest, err := ns.Digest()
	if err != nil {
		return fsLayout{}, err
	}
	cj, err := ns.ConfigJSON()
	if err != nil {
		return fsLayout{}, err
	}
	return fsLayout{Directory: base, Blocks: blocks, Digest: digest, Fields: ns.Fields(), ConfigJSON: string(cj), ns: ns}, nil
}

func (l fsLayout) print(w io.Writer, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(l)
	}
	if l.Tier != "" {
		fmt.Fprintf(w, "tier       %s\n", l.Tier)
	}
	fmt.Fprintf(w, "directory  %s\nblocks     %s\ndigest     %s\nconfig.json:\n%s\n", l.Directory, l.Blocks, l.Digest, l.ConfigJSON)
	fmt.Fprintf(w, "fs tier keys:\n  namespace: %s\n", namespaceYAML(l.ns))
	return nil
}

// namespaceYAML renders ns as the flow mapping an fs tier entry takes.
func namespaceYAML(ns filemapper.Namespace) string {
	q := strconv.Quote
	parts := []string{
		"model_name: " + q(ns.ModelName), "dtype: " + q(ns.DType),
		"tokens_per_hash: " + strconv.Itoa(ns.TokensPerHash),
	}
	ints := []struct {
		k    string
		v, d int
	}{{"blocks_per_file", ns.BlocksPerFile, 1}, {"tp_size", ns.TPSize, 1}, {"pp_size", ns.PPSize, 1},
		{"pcp_size", ns.PCPSize, 1}, {"dcp_size", ns.DCPSize, 1}, {"rank", ns.Rank, 0}}
	for _, iv := range ints {
		if iv.v != iv.d && iv.v != 0 {
			parts = append(parts, iv.k+": "+strconv.Itoa(iv.v))
		}
	}
	if ns.ParallelAgnostic != nil {
		parts = append(parts, "parallel_agnostic: "+strconv.FormatBool(*ns.ParallelAgnostic))
	}
	if ns.ReplicatedLayout {
		parts = append(parts, "replicated_layout: true")
	}
	if ns.CanonicalFormat != "" {
		parts = append(parts, "canonical_format: "+q(ns.CanonicalFormat))
	}
	if ns.InferenceEngine != "" && ns.InferenceEngine != "vllm" {
		parts = append(parts, "inference_engine: "+q(ns.InferenceEngine))
	}
	if len(ns.KVCacheGroups) > 0 {
		var gs []string
		for _, g := range ns.KVCacheGroups {
			names := make([]string, len(g.LayerNames))
			for i, n := range g.LayerNames {
				names[i] = q(n)
			}
			gs = append(gs, fmt.Sprintf("{tokens_per_block: %d, layer_names: [%s]}", g.TokensPerBlock, strings.Join(names, ", ")))
		}
		parts = append(parts, "kv_cache_groups: ["+strings.Join(gs, ", ")+"]")
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

func fsLayoutOfConfig(w io.Writer, path, tierName string, asJSON bool) error {
	cfg, err := config.Load(path)
	if err != nil {
		return err
	}
	tiers, err := tierset.FSTiers(cfg)
	if err != nil {
		return err
	}
	shown := 0
	for _, tc := range tiers {
		if tierName != "" && tc.Name != tierName {
			continue
		}
		f, err := fs.ParseFormat(tc.Format)
		if err != nil {
			return fmt.Errorf("fs-layout: tier %s: %w", tc.Name, err)
		}
		l, err := describeLayout(tc.RootDir, tc.Namespace, f)
		if err != nil {
			return fmt.Errorf("fs-layout: tier %s: %w", tc.Name, err)
		}
		l.Tier = tc.Name
		if shown > 0 && !asJSON {
			fmt.Fprintln(w)
		}
		if err := l.print(w, asJSON); err != nil {
			return err
		}
		shown++
	}
	if shown == 0 {
		if tierName != "" {
			return fmt.Errorf("fs-layout: %s has no fs tier named %q", path, tierName)
		}
		return fmt.Errorf("fs-layout: %s declares no fs tier", path)
	}
	return nil
}
