package fs

import (
	"errors"
	iofs "io/fs"
	"path/filepath"
	"strings"
	"sync"

	"github.com/kvtier/kvtier/vfs"
)

// maxKnownDirs bounds the fan-out directories a tier remembers as
// existing (about 40 bytes each). With vLLM's layout there are a million
// leaf directories per rank, so the set is a cache of recent ones, not a
// mirror of the tree: it is emptied when full.
const maxKnownDirs = 4096

// dirCache remembers leaf fan-out directories known to exist, so that a
// store into one opens its temp file at once, and a store into an
// unknown one creates the directory with one mkdir instead of failing an
// open and walking the path with MkdirAll (three stats and two mkdirs
// per block on a fresh tree).
type dirCache struct {
	root string // the rank directory; entries are relative to it

	mu    sync.Mutex
	known map[string]struct{}
}

func newDirCache(root string) *dirCache {
	return &dirCache{root: root, known: make(map[string]struct{})}
}

func (c *dirCache) rel(dir string) string {
	return strings.TrimPrefix(strings.TrimPrefix(dir, c.root), string(filepath.Separator))
}

func (c *dirCache) has(dir string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.known[c.rel(dir)]
	return ok
}

func (c *dirCache) add(dir string) {
	r := strings.Clone(c.rel(dir)) // do not pin the caller's whole path
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.known) >= maxKnownDirs {
		clear(c.known)
	}
	c.known[r] = struct{}{}
}

func (c *dirCache) forget(dir string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.known, c.rel(dir))
}

// openTemp creates the temp file tmp with flag, creating its directory
// first unless it is known to exist. A known directory that was removed
// behind the tier's back is forgotten and created again.
func (t *Tier) openTemp(tmp string, flag int) (vfs.File, error) {
	dir := filepath.Dir(tmp)
	known := t.dirs.has(dir)
	if !known {
		if err := t.makeDir(dir); err != nil {
			return nil, err
		}
	}
	f, err := t.s.fs.OpenFile(tmp, flag, 0o600)
	if known && errors.Is(err, iofs.ErrNotExist) {
		t.dirs.forget(dir)
		if err = t.makeDir(dir); err == nil {
			f, err = t.s.fs.OpenFile(tmp, flag, 0o600)
		}
	}
	return f, err
}

// makeDir makes sure the leaf directory dir exists. Most leaves of a
// tree in vLLM's layout are new when a block arrives, so the leaf is
// created first; only when its parent is missing too is the parent made
// (and the whole path when even the rank directory is gone).
func (t *Tier) makeDir(dir string) error {
	fs := t.s.fs
	err := fs.Mkdir(dir, 0o700)
	if errors.Is(err, iofs.ErrNotExist) {
		err = fs.Mkdir(filepath.Dir(dir), 0o700)
		switch {
		case err == nil || errors.Is(err, iofs.ErrExist):
			err = fs.Mkdir(dir, 0o700)
		case errors.Is(err, iofs.ErrNotExist):
			err = fs.MkdirAll(dir, 0o700)
		}
	}
	if err != nil && !errors.Is(err, iofs.ErrExist) {
		return err
	}
	t.dirs.add(dir)
	return nil
}
