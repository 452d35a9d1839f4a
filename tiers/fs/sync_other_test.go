//go:build !linux

package fs

import "os"

func syncfs(f *os.File) error { return f.Sync() }
