//go:build unix

package slotpipe

import (
	"errors"
	"syscall"

	"golang.org/x/sys/unix"
)

// writeNow writes as much of vec as the socket takes without blocking, in
// one writev, and returns how many bytes that was (0 when it takes none).
func writeNow(rc syscall.RawConn, vec [][]byte) (int, error) {
	var n int
	var werr error
	err := rc.Write(func(fd uintptr) bool {
		n, werr = unix.Writev(int(fd), vec)
		return true // one attempt: never wait for room
	})
	switch {
	case err != nil:
		return 0, err
	case errors.Is(werr, unix.EAGAIN), errors.Is(werr, unix.EWOULDBLOCK), errors.Is(werr, unix.EINTR):
		return 0, nil
	case werr != nil:
		return 0, werr
	}
	return max(n, 0), nil
}

// canWriteNow: writeNow works here.
const canWriteNow = true
