//go:build !linux

package vfs

import (
	"errors"
	"os"
)

func setDirect(*os.File, bool) error { return errors.ErrUnsupported }

func syncFS(string) error { return errors.ErrUnsupported }
