//go:build unix

package slotpipe

import (
	"net"
	"syscall"
)

// alive reports whether an idle connection can still carry a command:
// the server has not closed it and sent nothing unasked (a server closes
// idle clients after its timeout, and a restarted one resets them). It
// peeks without blocking; a connection it cannot inspect counts as alive.
func alive(nc net.Conn) bool {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	ok = false
	err = rc.Read(func(fd uintptr) bool {
		var b [1]byte
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		// Nothing to read and no error: open and quiet.
		ok = n < 0 && (err == syscall.EAGAIN || err == syscall.EWOULDBLOCK)
		return true
	})
	return err == nil && ok
}
