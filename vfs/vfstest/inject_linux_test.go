package vfstest

import (
	"errors"
	iofs "io/fs"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/kvtier/kvtier/vfs"
)

func TestInjectSetDirectAndMkdir(t *testing.T) {
	dir := t.TempDir()
	in := NewInjector(vfs.OS(), func(op Op, _ string) *Fault {
		if op == OpSetDirect || op == OpMkdir {
			return &Fault{Err: syscall.EINVAL}
		}
		return nil
	})
	f, err := in.Create(filepath.Join(dir, "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.SetDirect(false); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("SetDirect: %v, want EINVAL", err)
	}
	if err := in.Mkdir(filepath.Join(dir, "d"), 0o755); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("Mkdir: %v, want EINVAL", err)
	}
	in.SetRule(nil)
	if err := in.Mkdir(filepath.Join(dir, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := in.Mkdir(filepath.Join(dir, "d"), 0o755); !errors.Is(err, iofs.ErrExist) {
		t.Fatalf("second Mkdir: %v, want ErrExist", err)
	}
	if err := in.Mkdir(filepath.Join(dir, "x", "y"), 0o755); !errors.Is(err, iofs.ErrNotExist) {
		t.Fatalf("Mkdir without parent: %v, want ErrNotExist", err)
	}
}
