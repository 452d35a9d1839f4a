//go:build !unix

package slotpipe

import (
	"errors"
	"syscall"
)

// writeNow cannot write without blocking on this platform: Set copies the
// whole value and writes it in the background.
func writeNow(syscall.RawConn, [][]byte) (int, error) {
	return 0, errors.New("slotpipe: no non-blocking write here")
}

// canWriteNow: writeNow does not work here.
const canWriteNow = false
