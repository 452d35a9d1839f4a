//go:build linux

package vfs

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

func directFlag(t *testing.T, f File) bool {
	t.Helper()
	of, ok := f.(osFile)
	if !ok {
		t.Fatalf("OS file is %T", f)
	}
	fl, err := unix.FcntlInt(of.Fd(), unix.F_GETFL, 0)
	if err != nil {
		t.Fatal(err)
	}
	return fl&unix.O_DIRECT != 0
}

func TestSetDirect(t *testing.T) {
	name := filepath.Join(t.TempDir(), "f")
	f, err := OS().OpenFile(name, os.O_CREATE|os.O_WRONLY|unix.O_DIRECT, 0o644)
	if errors.Is(err, syscall.EINVAL) {
		t.Skip("no O_DIRECT on this filesystem")
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if !directFlag(t, f) {
		t.Fatal("opened with O_DIRECT, flag not set")
	}
	if err := f.SetDirect(false); err != nil {
		t.Fatal(err)
	}
	if directFlag(t, f) {
		t.Fatal("O_DIRECT still set after SetDirect(false)")
	}
	// Unaligned writes work through the page cache now.
	if _, err := f.WriteAt([]byte("abc"), 1); err != nil {
		t.Fatal(err)
	}
	if err := f.SetDirect(true); err != nil {
		t.Fatal(err)
	}
	if !directFlag(t, f) {
		t.Fatal("O_DIRECT not set after SetDirect(true)")
	}
	if b, _ := os.ReadFile(name); string(b) != "\x00abc" {
		t.Fatalf("file = %q", b)
	}
}
