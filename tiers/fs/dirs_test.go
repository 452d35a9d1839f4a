package fs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"

	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/vfs"
	"github.com/kvtier/kvtier/vfs/vfstest"
)

// leafKey returns keys that share one leaf directory: hashes equal in
// their first five hex digits, group 0.
func leafKey(n byte) offload.Key {
	h := make([]byte, 32)
	h[0], h[1], h[2], h[31] = 0x12, 0x34, 0x50, n
	return offload.MakeKey(h, 0)
}

// opCounter counts the operations an Injector sees, by kind.
type opCounter struct {
	mu sync.Mutex
	n  map[vfstest.Op]int
}

func (c *opCounter) rule(op vfstest.Op, _ string) *vfstest.Fault {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[vfstest.Op]int{}
	}
	c.n[op]++
	return nil
}

func (c *opCounter) take(op vfstest.Op) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.n[op]
	c.n = nil
	return n
}

func TestFanOutDirectories(t *testing.T) {
	var ops opCounter
	in := vfstest.NewInjector(vfs.OS(), nil)
	tier := newTier(t, t.TempDir(), func(c *Config) { c.FS = in })
	a := newArena(bs, 4, true)
	in.SetRule(ops.rule)
	store := func(key offload.Key) {
		t.Helper()
		if res := run(t, tier, false, a, req("w"), []offload.Key{key}, []int64{0}); !res.Success {
			t.Fatalf("store %s: %+v", key, res)
		}
		if !onDisk(tier, key) {
			t.Fatalf("%s not on disk", key)
		}
	}

	store(leafKey(1)) // leaf and parent missing: mkdir leaf (ENOENT), parent, leaf
	if n := ops.take(vfstest.OpMkdir); n != 3 {
		t.Fatalf("first block of a fresh tree: %d mkdirs, want 3", n)
	}
	store(leafKey(2))
	if n := ops.take(vfstest.OpMkdir); n != 0 {
		t.Fatalf("second block of a known leaf: %d mkdirs, want 0", n)
	}
	h := []byte(leafKey(3).Hash())
	h[1] = 0x3f // hex 123f5…: same parent directory 123, leaf f5_g0
	store(offload.MakeKey(h, 0))
	if n := ops.take(vfstest.OpMkdir); n != 1 {
		t.Fatalf("new leaf under an existing parent: %d mkdirs, want 1", n)
	}

	// Removed behind the tier's back: the known leaf is made again.
	leaf := filepath.Dir(tier.Path(leafKey(1)))
	if err := os.RemoveAll(filepath.Dir(leaf)); err != nil {
		t.Fatal(err)
	}
	store(leafKey(4))
	// Even the rank directory.
	if err := os.RemoveAll(tier.lay.rankDir); err != nil {
		t.Fatal(err)
	}
	store(leafKey(5))
	store(k(7))

	// A directory that cannot be made fails the store and leaves nothing.
	in.SetRule(vfstest.On(vfstest.OpMkdir, "", vfstest.Fault{Err: syscall.EROFS}))
	res := run(t, tier, false, a, req("w"), []offload.Key{k(8)}, []int64{0})
	if res.Success || !errors.Is(res.Err, syscall.EROFS) {
		t.Fatalf("store under a failing mkdir: %+v", res)
	}
	if tmp := tempFiles(t, tier.lay.rankDir); len(tmp) != 0 {
		t.Fatalf("temp files left: %v", tmp)
	}
}

func TestDirCacheBounded(t *testing.T) {
	c := newDirCache("/r")
	for i := range maxKnownDirs + 10 {
		c.add(fmt.Sprintf("/r/%03x/00_g0", i))
	}
	if len(c.known) > maxKnownDirs {
		t.Fatalf("%d dirs remembered, bound %d", len(c.known), maxKnownDirs)
	}
	if !c.has(fmt.Sprintf("/r/%03x/00_g0", maxKnownDirs+9)) {
		t.Fatal("latest dir forgotten")
	}
	c.forget(fmt.Sprintf("/r/%03x/00_g0", maxKnownDirs+9))
	if c.has(fmt.Sprintf("/r/%03x/00_g0", maxKnownDirs+9)) {
		t.Fatal("forgotten dir still known")
	}
}
