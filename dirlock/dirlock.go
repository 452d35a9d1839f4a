// Package dirlock takes exclusive, advisory locks on directories a kvtier
// process owns (an fs tier's namespace directory, a daemon's socket), so
// that a second process refuses to start instead of touching files the
// first one is using. A lock is a file named LockName in the directory,
// held with flock(2): the kernel releases it when its holder exits, however
// it exits, so a crash never leaves a stale lock behind. The file records
// the holder's pid for the error message of the next one.
package dirlock

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// LockName is the name of the lock file in a locked directory.
const LockName = ".kvtier.lock"

// ErrLocked reports a directory another process holds.
var ErrLocked = errors.New("in use by another kvtier process")

// Lock is a held lock.
type Lock struct {
	f *os.File
	// Created is true when the lock file did not exist before.
	Created bool
	// Previous is what the lock file said before this process took it:
	// the description and pid of its last holder, which has exited.
	Previous string
}

// Acquire locks dir (which must exist) for what, a description for the
// lock file, e.g. "fs tier disk". It fails with an error wrapping
// ErrLocked, naming the holder's pid, when another process holds it.
func Acquire(dir, what string) (*Lock, error) {
	return AcquireFile(filepath.Join(dir, LockName), what)
}

// AcquireFile locks the file at path (created 0600 if absent), for locks
// that cannot live inside a directory of their own, such as a socket's.
func AcquireFile(path, what string) (*Lock, error) {
	for attempt := 0; ; attempt++ {
		l, err := acquireFile(path, what)
		if !errors.Is(err, errRemoved) || attempt == 2 {
			return l, err
		}
		// The holder removed the file as it released it (ReleaseAndRemove):
		// the lock just taken is on a file no one else can find.
	}
}

// errRemoved: the file was locked after its holder had removed it.
var errRemoved = errors.New("lock file removed by its previous holder")

func acquireFile(path, what string) (*Lock, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	created := err == nil
	if errors.Is(err, os.ErrExist) {
		f, err = os.OpenFile(path, os.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		owner, _ := os.ReadFile(path)
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%s: %w (%s)", filepath.Dir(path), ErrLocked, strings.TrimSpace(strings.ReplaceAll(string(owner), "\n", ", ")))
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	held, herr := f.Stat()
	named, nerr := os.Lstat(path)
	if herr != nil || nerr != nil || !os.SameFile(held, named) {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", path, errRemoved)
	}
	l := &Lock{f: f, Created: created}
	if prev, err := os.ReadFile(path); err == nil {
		l.Previous = string(prev)
	}
	if err := f.Truncate(0); err == nil {
		f.WriteAt([]byte(fmt.Sprintf("%s\npid %d\n", what, os.Getpid())), 0)
	}
	return l, nil
}

// Held reports whether another process holds the lock on dir, without
// taking it (for tools that must not run beside a daemon).
func Held(dir string) (bool, string) {
	path := filepath.Join(dir, LockName)
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, ""
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB); err != nil {
		owner, _ := os.ReadFile(path)
		return true, strings.TrimSpace(strings.ReplaceAll(string(owner), "\n", ", "))
	}
	unix.Flock(int(f.Fd()), unix.LOCK_UN)
	return false, ""
}

// Release releases the lock; the file stays. Release of a nil Lock does
// nothing.
func (l *Lock) Release() {
	if l == nil || l.f == nil {
		return
	}
	l.f.Close()
	l.f = nil
}

// ReleaseAndRemove removes the lock file, then releases the lock: for a
// lock file next to a file that is gone too (a file arena's, a daemon's
// socket). A process that opened the file before it went and locks it
// after sees that the path names another file, or none, and tries again
// (AcquireFile), so two processes never both hold the lock of one path.
func (l *Lock) ReleaseAndRemove() {
	if l == nil || l.f == nil {
		return
	}
	os.Remove(l.f.Name())
	l.Release()
}
