package fs

import (
	"bytes"
	"context"
	"errors"
	iofs "io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvtier/kvtier/dirlock"
	"github.com/kvtier/kvtier/offload"
)

// Issue 11, finding 7: block files were 0644 and directories 0755, so any
// local user could read KV data derived from prompts.
func TestFilesAreOwnerOnly(t *testing.T) {
	root := t.TempDir()
	tier := newTier(t, root, nil)
	a := newArena(bs, 4, true)
	a.fill(0, 1)
	run(t, tier, false, a, req("w"), []offload.Key{k(1)}, []int64{0})
	n := 0
	filepath.WalkDir(root, func(p string, d iofs.DirEntry, err error) error {
		if err != nil || p == root {
			return err
		}
		fi, _ := d.Info()
		want := os.FileMode(0o600)
		if d.IsDir() {
			want = 0o700
		}
		if fi.Mode().Perm() != want {
			t.Errorf("%s: mode %v, want %v", p, fi.Mode().Perm(), want)
		}
		n++
		return nil
	})
	if n < 4 {
		t.Fatalf("only %d entries under root", n)
	}
}

// Finding 8: a tier with another bytes_per_block on the same directory and
// model deleted the other size's valid blocks as corrupt and raised the
// corruption metric. kvtier's format names the block size in its
// directory; in vLLM's format (vLLM's directory) a file of another size
// is foreign: a miss, kept, not counted corrupt.
func TestBlockSizesNeverCollide(t *testing.T) {
	for _, format := range []string{"kvtier", "vllm"} {
		t.Run(format, func(t *testing.T) {
			root := t.TempDir()
			cfg := func(size int) func(*Config) {
				return func(c *Config) { c.Format = format; c.Namespace.BlockBytes = size }
			}
			small := newTier(t, root, cfg(bs))
			a := newArena(bs, 4, true)
			a.fill(0, 7)
			run(t, small, false, a, req("w"), []offload.Key{k(1)}, []int64{0})
			if err := small.Close(context.Background()); err != nil {
				t.Fatal(err)
			}

			big := newTier(t, root, cfg(2*bs))
			r := req("r")
			got := lookupAll(t, big, r, k(1))
			res := run(t, big, true, newArena(2*bs, 4, true), r, []offload.Key{k(1)}, []int64{0})
			st := big.Stats()
			if got[0] == offload.Hit || res.Success || st.CorruptBlocks != 0 {
				t.Fatalf("the other size's block: lookup %v, load %+v, corrupt %d", got[0], res, st.CorruptBlocks)
			}
			if err := big.Close(context.Background()); err != nil {
				t.Fatal(err)
			}

			small = newTier(t, root, cfg(bs))
			back := newArena(bs, 4, true)
			if res := run(t, small, true, back, req("r2"), []offload.Key{k(1)}, []int64{1}); !res.Success || !bytes.Equal(back.slot(1), a.slot(0)) {
				t.Fatalf("the first size's block after the second size ran: %+v", res)
			}
		})
	}
}

// Finding 9: format vllm started without saying it cannot detect files
// swapped for another key's.
func TestVLLMFormatWarnsAtStart(t *testing.T) {
	var log bytes.Buffer
	newTier(t, t.TempDir(), func(c *Config) {
		c.Format = "vllm"
		c.Logger = slog.New(slog.NewTextHandler(&log, nil))
	})
	if !strings.Contains(log.String(), "level=WARN") || !strings.Contains(log.String(), "no checksum") {
		t.Fatalf("no warning at start:\n%s", log.String())
	}
}

// A second kvtier process on the same root_dir and namespace (another
// daemon) refuses to start instead of sharing, evicting or sweeping the
// first one's files.
func TestSecondTierOnTheSameDirectoryRefuses(t *testing.T) {
	root := t.TempDir()
	newTier(t, root, nil)
	_, err := New(testConfig(root, nil))
	if !errors.Is(err, dirlock.ErrLocked) {
		t.Fatalf("second tier on the same directory: %v", err)
	}
	other := newTier(t, root, func(c *Config) { c.Namespace.ModelName = "another/model" })
	if other == nil {
		t.Fatal("a tier of another model shares the root")
	}
}
