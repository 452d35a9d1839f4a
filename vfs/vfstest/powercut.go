package vfstest

import (
	"github.com/kvtier/kvtier/vfs"

	iofs "io/fs"
	"os"
	"sync"
)

// Loss is what a power cut does to data written since the last sync.
type Loss uint8

const (
	// LoseToZeros keeps each file's size but zero-fills every byte
	// written since its last sync: ext4 with delayed allocation after the
	// size reached the journal but the data never left the page cache.
	LoseToZeros Loss = iota
	// LoseToTruncation cuts each file back to its size at its last sync
	// (0 for a file never synced).
	LoseToTruncation
)

// PowerCut is a vfs.FS over another one that remembers, per file, what was
// written since the file was last synced, and on Cut loses it. Metadata
// operations (create, rename, remove, mkdir) are treated as durable at
// once, which is the worst case for data: a file renamed into place
// survives the cut even though its bytes do not. It is safe for
// concurrent use.
type PowerCut struct {
	fs vfs.FS

	mu    sync.Mutex
	files map[string]*cutState // by current path
	cut   bool
}

// cutState is one file's unsynced writes.
type cutState struct {
	dirty      [][2]int64 // [offset, end) ranges written since the last sync
	syncedSize int64
}

// NewPowerCut wraps fs.
func NewPowerCut(fs vfs.FS) *PowerCut { return &PowerCut{fs: fs, files: make(map[string]*cutState)} }

// Cut simulates the power loss: every file's unsynced bytes are lost as
// loss says, and every later operation fails with ErrCrashed (the process
// died with the power). It returns the number of files that lost data.
func (p *PowerCut) Cut(loss Loss) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	n := 0
	for path, st := range p.files {
		if len(st.dirty) == 0 {
			continue
		}
		n++
		f, err := p.fs.OpenFile(path, os.O_WRONLY, 0)
		if err != nil {
			return n, err
		}
		fi, err := f.Stat()
		if err == nil {
			switch loss {
			case LoseToTruncation:
				err = f.Truncate(min(st.syncedSize, fi.Size()))
			default:
				for _, r := range st.dirty {
					end := min(r[1], fi.Size())
					if r[0] < end {
						if _, err = f.WriteAt(make([]byte, end-r[0]), r[0]); err != nil {
							break
						}
					}
				}
			}
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

func (p *PowerCut) check(op, path string) error {
	if p.cut {
		return &iofs.PathError{Op: op, Path: path, Err: ErrCrashed}
	}
	return nil
}

// track returns the state of a file opened for writing at path.
func (p *PowerCut) track(path string, trunc bool) *cutState {
	st := p.files[path]
	if st == nil || trunc {
		size := int64(0)
		if !trunc {
			if fi, err := p.fs.Stat(path); err == nil {
				size = fi.Size() // written before we watched: durable
			}
		}
		st = &cutState{syncedSize: size}
		p.files[path] = st
	}
	return st
}

func (p *PowerCut) open(name string, flag int, perm os.FileMode, create bool) (vfs.File, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.check("open", name); err != nil {
		return nil, err
	}
	var f vfs.File
	var err error
	if create {
		f, err = p.fs.Create(name)
	} else {
		f, err = p.fs.OpenFile(name, flag, perm)
	}
	if err != nil {
		return nil, err
	}
	if !create && flag&(os.O_WRONLY|os.O_RDWR) == 0 {
		return &cutFile{File: f, p: p}, nil
	}
	return &cutFile{File: f, p: p, st: p.track(name, create || flag&os.O_TRUNC != 0)}, nil
}

// Create implements FS.
func (p *PowerCut) Create(name string) (vfs.File, error) { return p.open(name, 0, 0, true) }

// OpenFile implements FS.
func (p *PowerCut) OpenFile(name string, flag int, perm os.FileMode) (vfs.File, error) {
	return p.open(name, flag, perm, false)
}

// Open implements FS.
func (p *PowerCut) Open(name string) (vfs.File, error) { return p.open(name, os.O_RDONLY, 0, false) }

// Rename implements FS: the rename itself is durable at once.
func (p *PowerCut) Rename(oldname, newname string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.check("rename", oldname); err != nil {
		return err
	}
	if err := p.fs.Rename(oldname, newname); err != nil {
		return err
	}
	if st, ok := p.files[oldname]; ok {
		delete(p.files, oldname)
		p.files[newname] = st
	} else {
		delete(p.files, newname)
	}
	return nil
}

// Remove implements FS.
func (p *PowerCut) Remove(name string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.check("remove", name); err != nil {
		return err
	}
	if err := p.fs.Remove(name); err != nil {
		return err
	}
	delete(p.files, name)
	return nil
}

// Stat implements FS.
func (p *PowerCut) Stat(name string) (os.FileInfo, error) {
	if err := p.alive("stat", name); err != nil {
		return nil, err
	}
	return p.fs.Stat(name)
}

// Mkdir implements FS.
func (p *PowerCut) Mkdir(dir string, perm os.FileMode) error {
	if err := p.alive("mkdir", dir); err != nil {
		return err
	}
	return p.fs.Mkdir(dir, perm)
}

// MkdirAll implements FS.
func (p *PowerCut) MkdirAll(dir string, perm os.FileMode) error {
	if err := p.alive("mkdir", dir); err != nil {
		return err
	}
	return p.fs.MkdirAll(dir, perm)
}

// ReadDir implements FS.
func (p *PowerCut) ReadDir(name string) ([]os.DirEntry, error) {
	if err := p.alive("readdir", name); err != nil {
		return nil, err
	}
	return p.fs.ReadDir(name)
}

// WalkDir implements FS.
func (p *PowerCut) WalkDir(root string, fn iofs.WalkDirFunc) error {
	if err := p.alive("walk", root); err != nil {
		return err
	}
	return p.fs.WalkDir(root, fn)
}

// SyncFS implements SyncFS: every file's data becomes durable.
func (p *PowerCut) SyncFS(dir string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.check("syncfs", dir); err != nil {
		return err
	}
	if s, ok := p.fs.(vfs.SyncFS); ok {
		if err := s.SyncFS(dir); err != nil {
			return err
		}
	}
	for path, st := range p.files {
		st.dirty = nil
		if fi, err := p.fs.Stat(path); err == nil {
			st.syncedSize = fi.Size()
		}
	}
	return nil
}

func (p *PowerCut) alive(op, path string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.check(op, path)
}

// cutFile records the writes of a file opened for writing.
type cutFile struct {
	vfs.File
	p  *PowerCut
	st *cutState // nil when read-only
}

func (f *cutFile) wrote(off int64, n int) {
	if f.st == nil || n <= 0 {
		return
	}
	f.p.mu.Lock()
	f.st.dirty = append(f.st.dirty, [2]int64{off, off + int64(n)})
	f.p.mu.Unlock()
}

// WriteAt implements File.
func (f *cutFile) WriteAt(b []byte, off int64) (int, error) {
	if err := f.p.alive("write", ""); err != nil {
		return 0, err
	}
	n, err := f.File.WriteAt(b, off)
	f.wrote(off, n)
	return n, err
}

// Write implements File. The offset is the file's size: the tiers append
// only to files they create.
func (f *cutFile) Write(b []byte) (int, error) {
	if err := f.p.alive("write", ""); err != nil {
		return 0, err
	}
	fi, err := f.File.Stat()
	if err != nil {
		return 0, err
	}
	n, err := f.File.Write(b)
	f.wrote(fi.Size(), n)
	return n, err
}

// Truncate implements File; the new size is durable at once (metadata).
func (f *cutFile) Truncate(size int64) error {
	if err := f.p.alive("truncate", ""); err != nil {
		return err
	}
	return f.File.Truncate(size)
}

// Sync implements File: the file's data so far becomes durable.
func (f *cutFile) Sync() error {
	if err := f.p.alive("sync", ""); err != nil {
		return err
	}
	if err := f.File.Sync(); err != nil {
		return err
	}
	if f.st != nil {
		fi, err := f.File.Stat()
		f.p.mu.Lock()
		f.st.dirty = nil
		if err == nil {
			f.st.syncedSize = fi.Size()
		}
		f.p.mu.Unlock()
	}
	return nil
}
