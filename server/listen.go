package server

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// listenUnix listens on a Unix socket at path with mode 0600. The socket
// is created inside a fresh 0700 directory next to path and renamed into
// place, so that it is never reachable with looser permissions (a umask
// change would be process-wide). A stale socket at path (nobody accepts
// on it) is replaced; a live one, or a file that is not a socket, is an
// error.
func listenUnix(path string) (net.Listener, error) {
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != os.ModeSocket {
			return nil, fmt.Errorf("listen on %s: path exists and is not a socket", path)
		}
		c, err := net.DialTimeout("unix", path, time.Second)
		if err == nil {
			c.Close()
			return nil, fmt.Errorf("listen on %s: another process is serving on this socket", path)
		}
		if !errors.Is(err, syscall.ECONNREFUSED) && !errors.Is(err, syscall.ENOENT) {
			return nil, fmt.Errorf("listen on %s: probe existing socket: %w", path, err)
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("listen on %s: remove stale socket: %w", path, err)
		}
	}
	dir, err := os.MkdirTemp(filepath.Dir(path), ".ks")
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	defer os.RemoveAll(dir)
	tmp := filepath.Join(dir, "s")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmp, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	// The name changes below; the server removes the socket itself.
	ln.SetUnlinkOnClose(false)
	if err := os.Chmod(tmp, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("listen on %s: chmod: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		ln.Close()
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	return ln, nil
}

// FitConnections fits each listener's connection bound to the process's
// file descriptor limit, first raising the soft limit to the hard one, so
// that a flood of connections on one listener (idle TCP clients that never
// send a token) cannot use up the descriptors the other listeners, the
// tiers and the arena need. It plans for four listeners: the API's Unix
// socket and TCP port, and the event publisher's two ports, which take
// the same bound (events.Config.MaxConns).
func FitConnections(limit int, log interface{ Info(string, ...any) }) int {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return limit
	}
	if rl.Cur < rl.Max {
		raised := rl
		raised.Cur = rl.Max
		if syscall.Setrlimit(syscall.RLIMIT_NOFILE, &raised) == nil {
			rl = raised
		}
	}
	// Four listeners; keep a fifth of the descriptors, and at least 64,
	// for everything else.
	avail := int(min(rl.Cur, 1<<20))
	per := limit
	if fit := (avail - max(64, avail/5)) / 4; fit < per {
		per = fit
		log.Info("connections per listener bounded by the file descriptor limit", "max_connections", per, "nofile", avail)
	}
	return max(per, 4)
}
