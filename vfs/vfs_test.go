package vfs

import (
	"errors"
	"io"
	iofs "io/fs"
	"path/filepath"
	"testing"
)

func TestOSRoundTrip(t *testing.T) {
	dir := t.TempDir()
	fs := OS()
	if err := fs.MkdirAll(filepath.Join(dir, "a", "b"), 0o755); err != nil {
		t.Fatal(err)
	}
	name := filepath.Join(dir, "a", "b", "f")
	f, err := fs.Create(name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := fs.Rename(name, name+"2"); err != nil {
		t.Fatal(err)
	}
	if _, err := fs.Stat(name); !errors.Is(err, iofs.ErrNotExist) {
		t.Fatalf("old name after rename: %v", err)
	}
	g, err := fs.Open(name + "2")
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	buf := make([]byte, 8)
	n, err := g.ReadAt(buf, 0)
	if n != 5 || err != io.EOF || string(buf[:n]) != "hello" {
		t.Fatalf("ReadAt = %d %v %q", n, err, buf[:n])
	}
	var seen []string
	if err := fs.WalkDir(dir, func(p string, d iofs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			seen = append(seen, filepath.Base(p))
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if len(seen) != 1 || seen[0] != "f2" {
		t.Fatalf("walk saw %v", seen)
	}
	if _, err := OS().Open(filepath.Join(dir, "missing")); !errors.Is(err, iofs.ErrNotExist) {
		t.Fatalf("open missing: %v", err)
	}
}
