package arena

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvtier/kvtier/offload"
)

func TestKinds(t *testing.T) {
	for _, kind := range []Kind{"", Anonymous, File, Memfd} {
		t.Run(string(kind), func(t *testing.T) {
			cfg := Config{SlotSize: 4096 + 3, NumSlots: 5, Kind: kind}
			if kind == File {
				cfg.Path = filepath.Join(t.TempDir(), "arena")
			}
			a, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			if a.SlotSize() != cfg.SlotSize || a.NumSlots() != 5 || a.Size() != int64(5*cfg.SlotSize) {
				t.Fatalf("geometry %d×%d", a.SlotSize(), a.NumSlots())
			}
			for i := range int64(5) {
				s, err := a.Slot(i)
				if err != nil {
					t.Fatal(err)
				}
				if len(s) != cfg.SlotSize || cap(s) != cfg.SlotSize {
					t.Fatalf("slot %d: len %d cap %d", i, len(s), cap(s))
				}
				for j := range s {
					if s[j] != 0 {
						t.Fatalf("slot %d not zeroed", i)
					}
				}
				s[0], s[len(s)-1] = byte(i+1), byte(i+100)
			}
			// Slots do not overlap.
			for i := range int64(5) {
				s, _ := a.Slot(i)
				if s[0] != byte(i+1) || s[len(s)-1] != byte(i+100) {
					t.Fatalf("slot %d overwritten: %d %d", i, s[0], s[len(s)-1])
				}
			}
			for _, i := range []int64{-1, 5, 1 << 40} {
				if _, err := a.Slot(i); !errors.Is(err, offload.ErrSlotOutOfRange) {
					t.Errorf("Slot(%d) = %v, want ErrSlotOutOfRange", i, err)
				}
			}
			if err := a.Close(); err != nil {
				t.Fatal(err)
			}
			if _, err := a.Slot(0); !errors.Is(err, ErrClosed) {
				t.Errorf("Slot after Close = %v, want ErrClosed", err)
			}
			if err := a.Close(); err != nil {
				t.Errorf("second Close: %v", err)
			}
			if cfg.Path != "" {
				if _, err := os.Stat(cfg.Path); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("arena file left behind: %v", err)
				}
			}
		})
	}
}

// TestSharedFile maps a File arena a second time, as an engine would, and
// checks that both mappings see the same bytes and that the file is 0600.
func TestSharedFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "arena")
	// The stale arena of a kvtier daemon that died: its lock file carries
	// the marker, nobody holds it.
	if err := os.WriteFile(path, []byte("stale"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path+".lock", []byte(lockWhat+"\npid 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	a, err := New(Config{SlotSize: 64, NumSlots: 4, Kind: File, Path: path})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if a.Path() != path || a.File() == nil {
		t.Fatalf("Path %q File %v", a.Path(), a.File())
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", fi.Mode().Perm())
	}
	s, _ := a.Slot(0)
	if s[0] != 0 {
		t.Errorf("stale contents survived: %q", s[:5])
	}
	b, err := Open(path, 64, 4)
	if err != nil {
		t.Fatal(err)
	}
	s, _ = a.Slot(2)
	copy(s, "hello")
	v, _ := b.Slot(2)
	if string(v[:5]) != "hello" {
		t.Errorf("second mapping sees %q", v[:5])
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Errorf("Open's Close removed the owner's file: %v", err)
	}
	if _, err := Open(path, 64, 5); !errors.Is(err, ErrInvalidSize) {
		t.Errorf("Open larger than file = %v, want ErrInvalidSize", err)
	}
}

func TestMemfdShared(t *testing.T) {
	a, err := New(Config{SlotSize: 128, NumSlots: 2, Kind: Memfd})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if a.Path() != "" || a.File() == nil {
		t.Fatalf("Path %q File %v", a.Path(), a.File())
	}
	b, err := Open(fmt.Sprintf("/proc/self/fd/%d", a.File().Fd()), 128, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	v, _ := b.Slot(1)
	copy(v, "via fd")
	s, _ := a.Slot(1)
	if string(s[:6]) != "via fd" {
		t.Errorf("memfd not shared: %q", s[:6])
	}
}

func TestErrors(t *testing.T) {
	dir := t.TempDir()
	link := filepath.Join(dir, "link")
	if err := os.Symlink(filepath.Join(dir, "target"), link); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		cfg  Config
		size bool // want ErrInvalidSize
	}{
		{"zero slot size", Config{SlotSize: 0, NumSlots: 1}, true},
		{"negative slots", Config{SlotSize: 1, NumSlots: -1}, true},
		{"too many slots", Config{SlotSize: 1, NumSlots: MaxSlots + 1}, true},
		{"overflow", Config{SlotSize: 1 << 62, NumSlots: 1 << 10}, true},
		{"larger than memory", Config{SlotSize: 1 << 40, NumSlots: 1 << 10}, true},
		{"file without path", Config{SlotSize: 8, NumSlots: 1, Kind: File}, false},
		{"anonymous with path", Config{SlotSize: 8, NumSlots: 1, Path: "/x"}, false},
		{"unknown kind", Config{SlotSize: 8, NumSlots: 1, Kind: "hugepages"}, false},
		{"missing directory", Config{SlotSize: 8, NumSlots: 1, Kind: File, Path: filepath.Join(dir, "no", "such")}, false},
		{"symlink", Config{SlotSize: 8, NumSlots: 1, Kind: File, Path: link}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, err := New(tc.cfg)
			if err == nil {
				a.Close()
				t.Fatal("New succeeded")
			}
			if tc.size != errors.Is(err, ErrInvalidSize) {
				t.Errorf("err = %v; ErrInvalidSize want %v", err, tc.size)
			}
		})
	}
	if _, err := os.Lstat(filepath.Join(dir, "target")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("symlink target was created: %v", err)
	}
}

// Issue 11, finding 1: a second arena on a path in use, or on a file that
// is not a kvtier arena, fails without touching anything.
func TestFileArenaNeverClobbers(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "arena")
	a, err := New(Config{SlotSize: 64, NumSlots: 4, Kind: File, Path: path})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	s, _ := a.Slot(2)
	copy(s, "live bytes")
	if _, err := New(Config{SlotSize: 64, NumSlots: 8, Kind: File, Path: path}); !errors.Is(err, ErrInUse) {
		t.Fatalf("second arena on a live one: %v, want ErrInUse", err)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Size() != 4*64 {
		t.Fatalf("live arena after the second attempt: %v, %v", fi, err)
	}
	if s, _ := a.Slot(2); string(s[:10]) != "live bytes" {
		t.Fatalf("live arena's bytes changed: %q", s[:10])
	}
	if _, err := os.Stat(path + ".lock"); err != nil {
		t.Fatalf("the live arena's lock file went: %v", err)
	}

	other := filepath.Join(dir, "notes.txt")
	if err := os.WriteFile(other, []byte("precious"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{SlotSize: 64, NumSlots: 4, Kind: File, Path: other}); !errors.Is(err, ErrNotArena) {
		t.Fatalf("arena on an unrelated file: %v, want ErrNotArena", err)
	}
	if b, err := os.ReadFile(other); err != nil || string(b) != "precious" {
		t.Fatalf("unrelated file after the attempt: %q, %v", b, err)
	}
	if _, err := os.Stat(other + ".lock"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a lock file was left next to the unrelated file: %v", err)
	}
}
