package fs

import (
	"errors"
	iofs "io/fs"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/kvtier/kvtier/offload"
)

// scan rebuilds the index from the rank directory without reading any
// block: names give the keys, stat gives sizes and modification times
// (older files are evicted first). Leftover temp files are removed.
func (t *Tier) scan() error {
	type found struct {
		key   offload.Key
		size  int64
		mtime time.Time
	}
	var files []found
	var skipped int
	root := t.lay.rankDir
	err := t.s.fs.WalkDir(root, func(p string, d iofs.DirEntry, err error) error {
		if err != nil {
			if p == root {
				return err
			}
			t.s.logger.Warn("index rebuild: skipping unreadable entry", "path", p, "err", err)
			if d != nil && d.IsDir() {
				return iofs.SkipDir
			}
			return nil
		}
		if d.IsDir() {
			return nil
		}
		if strings.HasSuffix(p, ".tmp") {
			if err := t.s.fs.Remove(p); err != nil && !errors.Is(err, iofs.ErrNotExist) {
				t.s.logger.Warn("index rebuild: cannot remove temp file", "path", p, "err", err)
			} else {
				t.st.tempRemovedAtStart.Add(1)
			}
			return nil
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return nil
		}
		k, ok := parsePath(rel)
		if !ok || !d.Type().IsRegular() {
			skipped++
			return nil
		}
		fi, err := d.Info()
		if err != nil || fi.Size() > int64(^uint32(0)) {
			skipped++
			return nil
		}
		files = append(files, found{key: k, size: fi.Size(), mtime: fi.ModTime()})
		return nil
	})
	if err != nil {
		return err
	}
	slices.SortStableFunc(files, func(a, b found) int { return a.mtime.Compare(b.mtime) })
	t.mu.Lock()
	for _, f := range files {
		if _, ok := t.idx.find(f.key); !ok {
			t.idx.insert(f.key, f.size)
		}
	}
	used := t.idx.used
	t.mu.Unlock()
	if len(files) > 0 || skipped > 0 {
		t.s.logger.Info("index rebuilt", "dir", root, "files", len(files), "bytes", used, "ignored", skipped)
	}
	t.evictToLow()
	return nil
}
