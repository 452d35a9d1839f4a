package fs

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvtier/kvtier/confvalue"
)

// age sets p's modification time d into the past.
func age(t *testing.T, p string, d time.Duration) {
	t.Helper()
	old := time.Now().Add(-d)
	if err := os.Chtimes(p, old, old); err != nil {
		t.Fatal(err)
	}
}

// leftover writes a temp file next to k(n)'s block file, aged by d.
func leftover(t *testing.T, tier *Tier, n int, d time.Duration) string {
	t.Helper()
	p := tier.Path(k(n)) + "_other.tmp"
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte("partial block"), 0o644); err != nil {
		t.Fatal(err)
	}
	age(t, p, d)
	return p
}

func exists(p string) bool { _, err := os.Stat(p); return err == nil }

// Start-up removes only temp files at least stale_tmp_age old: younger
// ones may be another process's writes in progress.
func TestStartupKeepsYoungTempFiles(t *testing.T) {
	for _, tc := range []struct {
		name  string
		limit time.Duration // stale_tmp_age; 0 = default
		ages  []time.Duration
		kept  []bool
	}{
		{"default", 0,
			[]time.Duration{0, 9 * time.Minute, 10*time.Minute + time.Second, 24 * time.Hour},
			[]bool{true, true, false, false}},
		{"configured", time.Hour,
			[]time.Duration{30 * time.Minute, 59 * time.Minute, 61 * time.Minute},
			[]bool{true, true, false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			setup := newTier(t, dir, nil)
			var paths []string
			for i, d := range tc.ages {
				paths = append(paths, leftover(t, setup, i, d))
			}
			setup.Close(context.Background())

			tier := newTier(t, dir, func(c *Config) { c.StaleTmpAge = confvalue.Duration(tc.limit) })
			removed := 0
			for i, p := range paths {
				if exists(p) != tc.kept[i] {
					t.Errorf("temp file aged %v: kept %v, want %v", tc.ages[i], exists(p), tc.kept[i])
				}
				if !tc.kept[i] {
					removed++
				}
			}
			if got := tier.Stats().TempFilesRemoved; got != uint64(removed) {
				t.Fatalf("TempFilesRemoved = %d, want %d", got, removed)
			}
		})
	}
}

// Temp files too young at start are looked at again once they could be
// stale: removed then unless modified since or gone.
func TestYoungTempFilesSweptLater(t *testing.T) {
	const limit = time.Second
	dir := t.TempDir()
	setup := newTier(t, dir, nil)
	crashed := leftover(t, setup, 1, 0) // a quick restart's own crash leftover
	active := leftover(t, setup, 2, 0)  // another writer keeps writing it
	renamed := leftover(t, setup, 3, 0) // its writer renames it into place
	setup.Close(context.Background())

	tier := newTier(t, dir, func(c *Config) { c.StaleTmpAge = confvalue.Duration(limit) })
	if !exists(crashed) || !exists(active) || !exists(renamed) {
		t.Fatal("young temp files removed at start")
	}
	if err := os.Rename(renamed, strings.TrimSuffix(renamed, "_other.tmp")); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for exists(crashed) {
		if time.Now().After(deadline) {
			t.Fatal("stale temp file still there long after stale_tmp_age")
		}
		if err := os.WriteFile(active, []byte("more"), 0o644); err != nil {
			t.Fatal(err)
		}
		time.Sleep(limit / 20)
	}
	if !exists(active) {
		t.Fatal("temp file being written was removed")
	}
	// Once its writer stops, it goes too.
	deadline = time.Now().Add(10 * time.Second)
	for exists(active) {
		if time.Now().After(deadline) {
			t.Fatal("abandoned temp file never removed")
		}
		time.Sleep(limit / 10)
	}
	if got := tier.Stats().TempFilesRemoved; got != 2 {
		t.Fatalf("TempFilesRemoved = %d, want 2", got)
	}
}

func TestCloseStopsTempSweep(t *testing.T) {
	const limit = 100 * time.Millisecond
	dir := t.TempDir()
	setup := newTier(t, dir, nil)
	p := leftover(t, setup, 1, 0)
	setup.Close(context.Background())
	tier := newTier(t, dir, func(c *Config) { c.StaleTmpAge = confvalue.Duration(limit) })
	if err := tier.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * limit)
	if !exists(p) {
		t.Fatal("a closed tier removed a temp file")
	}
}

func TestStaleTmpAgeConfig(t *testing.T) {
	var c Config
	if err := decodeStrict("root_dir: /x\nstale_tmp_age: 30m\n", &c); err != nil {
		t.Fatal(err)
	}
	c.Namespace = testNamespace()
	s, err := c.settings()
	if err != nil || s.staleTmpAge != 30*time.Minute {
		t.Fatalf("settings: %v, %v", s.staleTmpAge, err)
	}
	c.StaleTmpAge = 0
	if s, _ := c.settings(); s.staleTmpAge != DefaultStaleTmpAge {
		t.Fatalf("default stale_tmp_age = %v", s.staleTmpAge)
	}
	c.StaleTmpAge = confvalue.Duration(-time.Second)
	if _, err := c.settings(); err == nil || !strings.Contains(err.Error(), "stale_tmp_age") {
		t.Fatalf("negative stale_tmp_age: %v", err)
	}
	if err := decodeStrict("root_dir: /x\nstale_tmp_age: 600\n", &Config{}); err == nil {
		t.Fatal("a bare number accepted as a duration")
	}
}
