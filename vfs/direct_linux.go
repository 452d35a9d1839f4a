//go:build linux

package vfs

import (
	"os"

	"golang.org/x/sys/unix"
)

func setDirect(f *os.File, on bool) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) {
		var fl int
		if fl, ferr = unix.FcntlInt(fd, unix.F_GETFL, 0); ferr != nil {
			return
		}
		want := fl &^ unix.O_DIRECT
		if on {
			want |= unix.O_DIRECT
		}
		if want != fl {
			_, ferr = unix.FcntlInt(fd, unix.F_SETFL, want)
		}
	}); err != nil {
		return err
	}
	return ferr
}

func syncFS(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = unix.Syncfs(int(fd)) }); err != nil {
		return err
	}
	return serr
}
