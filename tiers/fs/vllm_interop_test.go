package fs

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	iofs "io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvtier/kvtier/offload"
)

// The tests in this file treat the directory as vLLM's FS tier sees it
// (docs/semantics.md §5.1), computing every name by hand rather than through layout,
// so that a mistake in layout cannot cancel out in the comparison.

// vllmFieldsJSON is testNamespace() rendered as vLLM's FileMapper hashes
// it: json.dumps(fields, sort_keys=True, separators=(",", ":")).
const vllmFieldsJSON = `{"blocks_per_file":1,"dcp_size":1,"dtype":"torch.float16","inference_engine":"vllm",` +
	`"kv_cache_groups":[{"layer_names":["l0"],"tokens_per_block":16}],"model_name":"org/model",` +
	`"pcp_size":1,"pp_size":1,"tokens_per_hash":16,"tp_size":1}`

// vllmBase is <root>/<model with / → _>_<sha256(fields)[:12]>, checked
// once against Python's hashlib (bff676f2ecb7).
func vllmBase(t *testing.T, root string) string {
	t.Helper()
	sum := sha256.Sum256([]byte(vllmFieldsJSON))
	digest := hex.EncodeToString(sum[:])[:12]
	if digest != "bff676f2ecb7" {
		t.Fatalf("digest of the literal fields %s, Python says bff676f2ecb7", digest)
	}
	return filepath.Join(root, "org_model_"+digest)
}

// vllmPath is vLLM's get_file_name for a block hash and group under rank.
func vllmPath(base string, rank int, hash []byte, group uint32) string {
	x := hex.EncodeToString(hash)
	return fmt.Sprintf("%s_r%d/%s/%s_g%d/%s.bin", base, rank, x[:3], x[3:5], group, x)
}

func vllmHash(n int) []byte {
	h := sha256.Sum256([]byte{byte(n), byte(n >> 8), 'v'})
	return h[:]
}

// A directory written by vLLM's FS tier (raw block bytes at vLLM's paths,
// its config.json) is served by a tier in format vllm: blocks found at
// start-up and blocks vLLM writes while the tier runs, byte for byte.
func TestVLLMWrittenDirectoryReadByTier(t *testing.T) {
	root := t.TempDir()
	base := vllmBase(t, root)
	const rank = 2
	blocks := map[offload.Key][]byte{}
	write := func(n int, group uint32) offload.Key {
		hash := vllmHash(n)
		data := make([]byte, bs)
		for i := range data {
			data[i] = byte(n*31 + i*7)
		}
		p := vllmPath(base, rank, hash, group)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		key := offload.MakeKey(hash, group)
		blocks[key] = data
		return key
	}
	// vLLM writes config.json (json.dumps(indent=2, sort_keys=True)) first.
	if err := os.MkdirAll(base, 0o755); err != nil {
		t.Fatal(err)
	}
	vllmConfig := "{\n  \"blocks_per_file\": 1,\n  \"model_name\": \"org/model\"\n}"
	if err := os.WriteFile(filepath.Join(base, "config.json"), []byte(vllmConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	before := []offload.Key{write(1, 0), write(2, 1), write(3, 0)}

	tier := newTier(t, root, func(c *Config) {
		c.Format = "vllm"
		c.Namespace.Rank = rank
		c.Namespace.BlockBytes = bs
	})
	if s := tier.Stats(); s.Files != 3 || s.UsedBytes != 3*bs {
		t.Fatalf("start-up index of vLLM's directory: %+v", s)
	}
	after := []offload.Key{write(4, 2)} // vLLM keeps writing while kvtier runs
	keys := append(before, after...)
	if got := lookupAll(t, tier, req("r"), keys...); !slices.Equal(got, results(offload.Hit, offload.Hit, offload.Hit, offload.Hit)) {
		t.Fatalf("lookups of vLLM's blocks = %v, want all HIT", got)
	}
	a := newArena(bs, len(keys), true)
	slots := []int64{0, 1, 2, 3}
	if res := run(t, tier, true, a, req("r"), keys, slots); !res.Success {
		t.Fatalf("load of vLLM's blocks: %+v", res)
	}
	for i, key := range keys {
		if !bytes.Equal(a.slot(slots[i]), blocks[key]) {
			t.Fatalf("block %d differs from the bytes vLLM wrote", i)
		}
		if _, err := os.Stat(vllmPath(base, rank, []byte(key.Hash()), key.Group())); err != nil {
			t.Fatalf("vLLM's file gone after the load: %v", err)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(base, "config.json")); string(b) != vllmConfig {
		t.Fatalf("vLLM's config.json rewritten: %s", b)
	}
	// Storing a block vLLM already wrote leaves vLLM's file alone.
	a.fill(0, 99)
	if res := run(t, tier, false, a, req("w"), keys[:1], []int64{0}); !res.Success || res.Bytes != 0 {
		t.Fatalf("store over vLLM's block: %+v", res)
	}
	if b, _ := os.ReadFile(vllmPath(base, rank, vllmHash(1), 0)); !bytes.Equal(b, blocks[keys[0]]) {
		t.Fatal("vLLM's block rewritten by a store")
	}
}

// A tier in format vllm writes exactly what vLLM's FS tier reads: the raw
// block bytes, nothing else, at vLLM's path for each key, and a
// config.json next to them; no temp files or other files remain.
func TestTierWrittenDirectoryReadableByVLLM(t *testing.T) {
	root := t.TempDir()
	base := vllmBase(t, root)
	const rank = 1
	tier := newTier(t, root, func(c *Config) { c.Format = "vllm"; c.Namespace.Rank = rank })
	// Both O_DIRECT paths: slots in place and through the bounce buffer.
	for _, aligned := range []bool{true, false} {
		a := newArena(bs, 3, aligned)
		var keys []offload.Key
		for i := range 3 {
			a.fill(int64(i), uint64(i)+map[bool]uint64{true: 10, false: 20}[aligned])
			keys = append(keys, offload.MakeKey(vllmHash(i+map[bool]int{true: 10, false: 20}[aligned]), uint32(i)))
		}
		if res := run(t, tier, false, a, req("w"), keys, []int64{0, 1, 2}); !res.Success {
			t.Fatalf("store: %+v", res)
		}
		for i, key := range keys {
			// What vLLM's load does: open its path, read block_size bytes.
			b, err := os.ReadFile(vllmPath(base, rank, []byte(key.Hash()), key.Group()))
			if err != nil {
				t.Fatalf("vLLM's path for key %d: %v", i, err)
			}
			if !bytes.Equal(b, a.slot(int64(i))) {
				t.Fatalf("file of key %d (%d bytes) is not the raw block (%d bytes)", i, len(b), bs)
			}
		}
	}
	if err := tier.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	var files []string
	filepath.WalkDir(root, func(p string, d iofs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			rel, _ := filepath.Rel(root, p)
			files = append(files, filepath.ToSlash(rel))
		}
		return nil
	})
	var blocks int
	for _, f := range files {
		switch {
		case f == "org_model_bff676f2ecb7/config.json":
		case f == "org_model_bff676f2ecb7/.kvtier.lock": // kvtier's own, next to vLLM's config.json
		case strings.HasPrefix(f, fmt.Sprintf("org_model_bff676f2ecb7_r%d/", rank)) && strings.HasSuffix(f, ".bin"):
			blocks++
		default:
			t.Errorf("unexpected file %s", f)
		}
	}
	if blocks != 6 {
		t.Fatalf("%d block files, want 6: %v", blocks, files)
	}
}
