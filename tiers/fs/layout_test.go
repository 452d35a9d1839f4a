package fs

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvtier/kvtier/filemapper"
	"github.com/kvtier/kvtier/offload"
)

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
		got, ok := filemapper.ParseRelPath(rel)
		if !ok || got != key {
			t.Fatalf("filemapper.ParseRelPath(%s) = %v %v, want %v", rel, got, ok, key)
		}
	}
	for _, bad := range []string{
		"abc/de_g0/abcdef.bin.x", "abc/de_g0/ABCDEF.bin", "abd/de_g0/abcdef.bin", "abc/df_g0/abcdef.bin",
		"abc/de_g01/abcdef.bin", "abc/de_gx/abcdef.bin", "abc/de/abcdef.bin", "x/abc/de_g0/abcdef.bin",
		"abc/de_g0/abcde.bin", "abc/de_g4294967296/abcdef.bin",
	} {
		if _, ok := filemapper.ParseRelPath(bad); ok {
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
		key, ok := filemapper.ParseRelPath(rel)
		if !ok {
			return
		}
		if !key.Valid() {
			t.Fatalf("filemapper.ParseRelPath(%q) accepted invalid key %q", rel, key)
		}
		if got := strings.TrimPrefix(l.path(key), "/r/"); got != filepath.ToSlash(rel) {
			t.Fatalf("filemapper.ParseRelPath(%q) = %v, whose path is %q", rel, key, got)
		}
	})
}
