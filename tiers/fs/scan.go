package fs

import (
	"errors"
	iofs "io/fs"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kvtier/kvtier/filemapper"
	"github.com/kvtier/kvtier/offload"
)

// scan rebuilds the index from the rank directory without reading any
// block: names give the keys, stat gives sizes and modification times
// (older files are evicted first). Leftover temp files older than
// stale_tmp_age are removed; younger ones are looked at again later.
func (t *Tier) scan() error {
	now := time.Now()
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
			if fi, err := d.Info(); err == nil { // else gone already
				t.leftoverTmp(p, fi.ModTime(), now)
			}
			return nil
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return nil
		}
		k, ok := filemapper.ParseRelPath(rel)
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
	if n := len(t.tmp.paths); n > 0 {
		t.s.logger.Info("temp files younger than stale_tmp_age left in place (another process may be writing them)",
			"dir", root, "files", n, "stale_tmp_age", t.s.staleTmpAge)
	}
	t.evictToLow()
	return nil
}

// maxYoungTmp bounds the young temp files a tier remembers for a second
// look; more are left for the next start.
const maxYoungTmp = 4096

// tmpSweep holds the temp files the start-up scan found too young to
// delete, and the timer of their second look.
type tmpSweep struct {
	mu      sync.Mutex // held while sweeping, so Close waits for a sweep
	paths   []string
	timer   *time.Timer
	stopped bool
}

// leftoverTmp handles a temp file found at start: removed when it was
// last modified at least stale_tmp_age before now, else remembered.
func (t *Tier) leftoverTmp(p string, mtime, now time.Time) {
	if now.Sub(mtime) < t.s.staleTmpAge {
		if len(t.tmp.paths) < maxYoungTmp {
			t.tmp.paths = append(t.tmp.paths, p)
		}
		return
	}
	t.removeTmp(p)
}

// removeTmp deletes a stale temp file; one gone meanwhile is not counted.
func (t *Tier) removeTmp(p string) {
	switch err := t.s.fs.Remove(p); {
	case err == nil:
		t.st.tempRemoved.Add(1)
	case !errors.Is(err, iofs.ErrNotExist):
		t.s.logger.Warn("cannot remove stale temp file", "path", p, "err", err)
	}
}

// startTmpSweep arms the second look at the young temp files, one
// stale_tmp_age after start: by then each is stale unless modified since.
func (t *Tier) startTmpSweep() {
	t.tmp.mu.Lock()
	defer t.tmp.mu.Unlock()
	if len(t.tmp.paths) > 0 {
		t.tmp.timer = time.AfterFunc(t.s.staleTmpAge, t.sweepTmp)
	}
}

// sweepTmp removes the remembered temp files that are stale by now.
// Files gone meanwhile (renamed into place or removed by their writer)
// are dropped; files modified since are kept and looked at again when
// the earliest of them can be stale.
func (t *Tier) sweepTmp() {
	t.tmp.mu.Lock()
	defer t.tmp.mu.Unlock()
	if t.tmp.stopped {
		return
	}
	now := time.Now()
	keep := t.tmp.paths[:0]
	next := t.s.staleTmpAge
	for _, p := range t.tmp.paths {
		fi, err := t.s.fs.Stat(p)
		if err != nil {
			continue
		}
		if wait := fi.ModTime().Add(t.s.staleTmpAge).Sub(now); wait > 0 {
			keep = append(keep, p)
			next = min(next, wait)
			continue
		}
		t.removeTmp(p)
	}
	clear(t.tmp.paths[len(keep):])
	t.tmp.paths = keep
	if len(keep) > 0 {
		t.tmp.timer = time.AfterFunc(next, t.sweepTmp)
	}
}

// stopTmpSweep cancels the second look, waiting for one in progress.
func (t *Tier) stopTmpSweep() {
	t.tmp.mu.Lock()
	defer t.tmp.mu.Unlock()
	t.tmp.stopped = true
	if t.tmp.timer != nil {
		t.tmp.timer.Stop()
	}
}
