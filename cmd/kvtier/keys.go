package main

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/kvtier/kvtier/blockhash"
)

type keysFlags struct {
	blockSize    int
	tokensPerKey int
	algo         string
	seed         string
	cacheSalt    string
	loraName     string
	loraPath     string
	lora         bool
	group        uint32
	hashes       bool
}

// keysInput is one prompt of `kvtier keys`: a JSON array of token ids, or
// an object whose fields override the flags for that prompt.
type keysInput struct {
	Tokens    []int64 `json:"tokens"`
	CacheSalt *string `json:"cache_salt"`
	LoRAName  *string `json:"lora_name"`
	LoRAPath  *string `json:"lora_path"`
}

// keysLine is one prompt's answer.
type keysLine struct {
	Keys        []string `json:"keys"`
	BlockHashes []string `json:"block_hashes,omitempty"`
	Error       string   `json:"error,omitempty"`
}

func newKeysCmd() *cobra.Command {
	var f keysFlags
	cmd := &cobra.Command{
		Use:   "keys --block-size N [flags] [FILE]",
		Short: "Compute the keys vLLM's offloading connector gives a prompt's blocks, from its token ids",
		Long: `keys reads prompts as token ids and prints the keys kvtier holds their
blocks under in a daemon fed by vLLM 0.33's offloading connector (both
integration modes): vLLM's block hashes computed as vLLM computes them
(package blockhash), the hash of each chunk's last block followed by the
KV-cache group. A router or an agent can then ask a daemon about a prompt
before any engine has seen it.

FILE (default: stdin; - is stdin) holds one JSON value per line: an array
of token ids, or an object {"tokens": [...], "cache_salt": "...",
"lora_name": "...", "lora_path": "..."} whose fields override the flags for
that prompt. Each prompt gets one JSON line: {"keys": ["hex", ...]} (with
--hashes also "block_hashes"), or {"error": "..."} for a line that cannot
be read. Only full chunks have keys.

What must match the engine: --block-size is its hash block size (the KV
cache block size for most models: --block-size of vllm serve), and
--tokens-per-key the offloading connector's block size (its block_size in
kv_connector_extra_config; default: the hash block size). --hash-algo is
--prefix-caching-hash-algo (sha256, the default, or sha256_cbor), --seed
the engine's PYTHONHASHSEED if it sets one. --group is the KV-cache group
(0 for models with one attention type). Multimodal prompts and prompt
embeddings add hash inputs that token ids do not carry: their keys cannot
be computed here.`,
		Example: `  echo '[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]' | kvtier keys --block-size 16
  kvtier keys --block-size 16 --tokens-per-key 256 --cache-salt tenant-a prompts.jsonl`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f.lora = cmd.Flags().Changed("lora-name")
			in := cmd.InOrStdin()
			if len(args) == 1 && args[0] != "-" {
				file, err := os.Open(args[0])
				if err != nil {
					return err
				}
				defer file.Close()
				in = file
			}
			return computeKeys(f, in, cmd.OutOrStdout())
		},
	}
	fl := cmd.Flags()
	fl.IntVar(&f.blockSize, "block-size", 0, "the engine's hash block size in tokens (required)")
	fl.IntVar(&f.tokensPerKey, "tokens-per-key", 0, "the offloading connector's block size in tokens (default: --block-size)")
	fl.StringVar(&f.algo, "hash-algo", blockhash.SHA256, "the engine's prefix caching hash algorithm: sha256 | sha256_cbor")
	fl.StringVar(&f.seed, "seed", "", "the engine's PYTHONHASHSEED (default: unset, vLLM's fixed seed)")
	fl.StringVar(&f.cacheSalt, "cache-salt", "", "the requests' cache_salt")
	fl.StringVar(&f.loraName, "lora-name", "", "the requests' LoRA adapter name (LoRARequest.lora_name)")
	fl.StringVar(&f.loraPath, "lora-path", "", "the requests' LoRA adapter path (LoRARequest.lora_path)")
	fl.Uint32Var(&f.group, "group", 0, "the KV-cache group index")
	fl.BoolVar(&f.hashes, "hashes", false, "print vLLM's block hashes too")
	_ = cmd.MarkFlagRequired("block-size")
	return cmd
}

// computeKeys answers each prompt of in on out. Options that cannot be
// used fail the command; a prompt that cannot be read fails its line.
func computeKeys(f keysFlags, in io.Reader, out io.Writer) error {
	base := blockhash.Options{Algo: f.algo, Seed: f.seed, HashBlockSize: f.blockSize, TokensPerKey: f.tokensPerKey, CacheSalt: f.cacheSalt}
	if f.lora {
		base.LoRA = &blockhash.LoRA{Name: f.loraName, Path: f.loraPath}
	}
	def, err := blockhash.New(base)
	if err != nil {
		return err
	}
	r := bufio.NewReaderSize(in, 1<<20)
	w := bufio.NewWriter(out)
	enc := json.NewEncoder(w)
	for n := 1; ; n++ {
		line, err := r.ReadBytes('\n')
		if len(bytes.TrimSpace(line)) > 0 {
			if werr := enc.Encode(keysFor(def, base, line, f.group, f.hashes)); werr != nil {
				return werr
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("reading prompts, line %d: %w", n, err)
		}
	}
	return w.Flush()
}

func keysFor(def *blockhash.Hasher, base blockhash.Options, line []byte, group uint32, hashes bool) keysLine {
	var in keysInput
	line = bytes.TrimSpace(line)
	if line[0] == '[' {
		if err := json.Unmarshal(line, &in.Tokens); err != nil {
			return keysLine{Error: "not an array of token ids: " + err.Error()}
		}
	} else if err := json.Unmarshal(line, &in); err != nil {
		return keysLine{Error: "not a prompt (an array of token ids or an object with tokens): " + err.Error()}
	}
	h := def
	if in.CacheSalt != nil || in.LoRAName != nil || in.LoRAPath != nil {
		o := base
		if in.CacheSalt != nil {
			o.CacheSalt = *in.CacheSalt
		}
		if in.LoRAName != nil || in.LoRAPath != nil {
			l := blockhash.LoRA{}
			if o.LoRA != nil {
				l = *o.LoRA
			}
			if in.LoRAName != nil {
				l.Name = *in.LoRAName
			}
			if in.LoRAPath != nil {
				l.Path = *in.LoRAPath
			}
			o.LoRA = &l
		}
		var err error
		if h, err = blockhash.New(o); err != nil {
			return keysLine{Error: err.Error()}
		}
	}
	out := keysLine{Keys: []string{}}
	for _, k := range h.Keys(in.Tokens, group) {
		out.Keys = append(out.Keys, k.String())
	}
	if hashes {
		for _, b := range h.BlockHashes(in.Tokens) {
			out.BlockHashes = append(out.BlockHashes, hex.EncodeToString(b))
		}
	}
	return out
}
