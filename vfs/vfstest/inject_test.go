package vfstest

import (
	"errors"
	"io"
	iofs "io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/kvtier/kvtier/vfs"
)

func TestInjectErrors(t *testing.T) {
	dir := t.TempDir()
	in := NewInjector(vfs.OS(), On(OpWrite, "full", Fault{Err: syscall.ENOSPC}))
	f, err := in.Create(filepath.Join(dir, "full"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("x"), 0); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("write: %v, want ENOSPC", err)
	}
	f.Close()
	g, err := in.Create(filepath.Join(dir, "ok"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.Write([]byte("x")); err != nil {
		t.Fatalf("unmatched path failed: %v", err)
	}
	g.Close()
	in.SetRule(On(OpOpen, "", Fault{Err: syscall.EIO}))
	if _, err := in.Open(filepath.Join(dir, "ok")); !errors.Is(err, syscall.EIO) {
		t.Fatalf("open: %v, want EIO", err)
	}
	if in.Injected() != 2 {
		t.Fatalf("Injected = %d, want 2", in.Injected())
	}
}

func TestInjectShort(t *testing.T) {
	dir := t.TempDir()
	name := filepath.Join(dir, "f")
	if err := os.WriteFile(name, []byte("0123456789"), 0o644); err != nil {
		t.Fatal(err)
	}
	in := NewInjector(vfs.OS(), On(OpRead, "", Fault{Short: true}))
	f, err := in.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 10)
	n, err := f.ReadAt(buf, 0)
	if n != 5 || err != io.EOF {
		t.Fatalf("short read = %d, %v; want 5, EOF", n, err)
	}
	f.Close()

	in.SetRule(On(OpWrite, "", Fault{Short: true}))
	w, err := in.Create(filepath.Join(dir, "w"))
	if err != nil {
		t.Fatal(err)
	}
	n, err = w.WriteAt([]byte("abcdef"), 0)
	if n != 3 || !errors.Is(err, io.ErrShortWrite) {
		t.Fatalf("short write = %d, %v; want 3, ErrShortWrite", n, err)
	}
	w.Close()
	if b, _ := os.ReadFile(filepath.Join(dir, "w")); string(b) != "abc" {
		t.Fatalf("file after short write = %q", b)
	}
}

func TestInjectCrash(t *testing.T) {
	dir := t.TempDir()
	tmp, dst := filepath.Join(dir, "x.tmp"), filepath.Join(dir, "x")
	in := NewInjector(vfs.OS(), On(OpRename, ".tmp", Fault{Crash: true}))
	f, err := in.Create(tmp)
	if err != nil {
		t.Fatal(err)
	}
	f.Write([]byte("data"))
	f.Close()
	if err := in.Rename(tmp, dst); !errors.Is(err, ErrCrashed) {
		t.Fatalf("rename: %v, want ErrCrashed", err)
	}
	if !in.Crashed() {
		t.Fatal("Crashed = false")
	}
	// Nothing works any more: cleanup cannot remove the temp file.
	if err := in.Remove(tmp); !errors.Is(err, ErrCrashed) {
		t.Fatalf("remove after crash: %v", err)
	}
	if _, err := os.Stat(tmp); err != nil {
		t.Fatalf("temp file gone after crash: %v", err)
	}
	if _, err := os.Stat(dst); !errors.Is(err, iofs.ErrNotExist) {
		t.Fatalf("destination exists after crash before rename: %v", err)
	}
}

func TestRuleCombinators(t *testing.T) {
	r := Once(After(1, On(OpStat, "", Fault{Err: syscall.EIO})))
	var got []bool
	for range 4 {
		got = append(got, r(OpStat, "p") != nil)
	}
	if want := []bool{false, true, false, false}; !equal(got, want) {
		t.Fatalf("fired = %v, want %v", got, want)
	}
	if r(OpOpen, "p") != nil {
		t.Fatal("rule fired for another op")
	}
}

func equal(a, b []bool) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
