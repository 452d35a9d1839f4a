package vfs

import (
	"io"
	iofs "io/fs"
	"os"
	"path/filepath"
)

// File is an open file. ReadAt and WriteAt follow io.ReaderAt and
// io.WriterAt: a short transfer comes with a non-nil error (io.EOF for a
// read that reached the end of the file).
type File interface {
	io.ReaderAt
	io.WriterAt
	io.Writer
	io.Closer
	Sync() error
	Stat() (os.FileInfo, error)
	// Truncate sets the file size.
	Truncate(size int64) error
	// SetDirect turns O_DIRECT on or off on the open file (fcntl F_SETFL
	// on Linux); elsewhere it fails with errors.ErrUnsupported. An
	// O_DIRECT writer uses it to write a file's unaligned tail through
	// the page cache instead of padding the tail to the alignment and
	// truncating the file back, which costs a journaled size change.
	SetDirect(on bool) error
}

// FS is the set of filesystem operations the storage tiers use. Paths are
// OS paths. Errors are *fs.PathError / *os.LinkError like the os package,
// so errors.Is(err, fs.ErrNotExist) and errors.Is(err, syscall.ENOSPC)
// work through any implementation.
type FS interface {
	// Create creates or truncates name for writing.
	Create(name string) (File, error)
	// OpenFile is os.OpenFile; flag may include O_DIRECT.
	OpenFile(name string, flag int, perm os.FileMode) (File, error)
	// Open opens name read-only.
	Open(name string) (File, error)
	Rename(oldname, newname string) error
	Remove(name string) error
	Stat(name string) (os.FileInfo, error)
	// Mkdir creates one directory; its parent must exist.
	Mkdir(dir string, perm os.FileMode) error
	MkdirAll(dir string, perm os.FileMode) error
	ReadDir(name string) ([]os.DirEntry, error)
	// WalkDir walks the tree at root like filepath.WalkDir.
	WalkDir(root string, fn iofs.WalkDirFunc) error
}

// OS returns the FS of the operating system.
func OS() FS { return osFS{} }

type osFS struct{}

func (osFS) Create(name string) (File, error) { return wrapOS(os.Create(name)) }

func (osFS) OpenFile(name string, flag int, perm os.FileMode) (File, error) {
	return wrapOS(os.OpenFile(name, flag, perm))
}

func (osFS) Open(name string) (File, error)                 { return wrapOS(os.Open(name)) }
func (osFS) Rename(oldname, newname string) error           { return os.Rename(oldname, newname) }
func (osFS) Remove(name string) error                       { return os.Remove(name) }
func (osFS) Stat(name string) (os.FileInfo, error)          { return os.Stat(name) }
func (osFS) Mkdir(dir string, perm os.FileMode) error       { return os.Mkdir(dir, perm) }
func (osFS) MkdirAll(dir string, perm os.FileMode) error    { return os.MkdirAll(dir, perm) }
func (osFS) ReadDir(name string) ([]os.DirEntry, error)     { return os.ReadDir(name) }
func (osFS) WalkDir(root string, fn iofs.WalkDirFunc) error { return filepath.WalkDir(root, fn) }

// SyncFS implements SyncFS with syncfs(2) (errors.ErrUnsupported off
// Linux).
func (osFS) SyncFS(dir string) error {
	if err := syncFS(dir); err != nil {
		return &iofs.PathError{Op: "syncfs", Path: dir, Err: err}
	}
	return nil
}

// osFile is an *os.File with SetDirect.
type osFile struct{ *os.File }

// SetDirect implements File.
func (f osFile) SetDirect(on bool) error {
	if err := setDirect(f.File, on); err != nil {
		return &iofs.PathError{Op: "setdirect", Path: f.Name(), Err: err}
	}
	return nil
}

// wrapOS avoids returning a non-nil File interface holding a nil *os.File.
func wrapOS(f *os.File, err error) (File, error) {
	if err != nil {
		return nil, err
	}
	return osFile{f}, nil
}

// SyncFS is implemented by filesystems that can flush every file's data
// in one call (syncfs(2) on Linux). A writer that makes a batch of files
// durable before renaming them uses it instead of one fsync per file.
type SyncFS interface {
	// SyncFS makes the data of every file of the filesystem holding dir
	// durable.
	SyncFS(dir string) error
}
