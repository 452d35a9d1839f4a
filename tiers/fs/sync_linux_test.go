//go:build linux

package fs

import (
	"os"

	"golang.org/x/sys/unix"
)

func syncfs(f *os.File) error { return unix.Syncfs(int(f.Fd())) }
