//go:build linux

package fs

import "golang.org/x/sys/unix"

// oDirect is the open flag that bypasses the page cache.
const oDirect = unix.O_DIRECT
