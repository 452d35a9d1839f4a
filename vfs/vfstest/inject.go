package vfstest

import (
	"github.com/kvtier/kvtier/vfs"

	"errors"
	"fmt"
	"io"
	iofs "io/fs"
	"os"
	"strings"
	"sync"
	"time"
)

// Op names an operation an Injector can fail.
type Op uint8

// Operations. OpenFile counts as OpCreate when its flags include
// O_CREATE and as OpOpen otherwise; WalkDir counts as OpReadDir; Mkdir
// and MkdirAll count as OpMkdir.
const (
	OpCreate Op = iota
	OpOpen
	OpRead
	OpWrite
	OpSync
	OpTruncate
	OpClose
	OpRename
	OpRemove
	OpStat
	OpMkdir
	OpReadDir
	OpSetDirect
)

var opNames = [...]string{"create", "open", "read", "write", "sync", "truncate", "close", "rename", "remove", "stat", "mkdir", "readdir", "setdirect"}

func (o Op) String() string {
	if int(o) < len(opNames) {
		return opNames[o]
	}
	return fmt.Sprintf("Op(%d)", uint8(o))
}

// ErrCrashed is returned by every operation of an Injector after a Fault
// with Crash set fired: the simulated process is dead.
var ErrCrashed = errors.New("vfs: simulated crash")

// Fault is what an Injector does to one operation.
type Fault struct {
	// Err is the error returned (wrapped in *fs.PathError), e.g.
	// syscall.ENOSPC or syscall.EIO. For Short it defaults to io.EOF
	// (reads) or io.ErrShortWrite (writes).
	Err error
	// Short makes a read or write transfer only half of its bytes. For
	// other operations it is ignored.
	Short bool
	// Crash kills the simulated process: the operation does not happen
	// (a Short write still writes its half) and every later operation
	// fails with ErrCrashed, so no cleanup code can run.
	Crash bool
	// Delay makes the operation wait this long first: a slow device.
	// With no Err, Short or Crash the operation then succeeds.
	Delay time.Duration
}

// Rule decides the fault of an operation on path; nil means none.
type Rule func(op Op, path string) *Fault

// On returns a rule that applies f to every op whose path contains
// pathSubstr ("" matches every path).
func On(op Op, pathSubstr string, f Fault) Rule {
	return func(o Op, path string) *Fault {
		if o == op && strings.Contains(path, pathSubstr) {
			return &f
		}
		return nil
	}
}

// After returns a rule that lets the first n faults of r pass untouched
// and applies the later ones.
func After(n int, r Rule) Rule {
	var mu sync.Mutex
	seen := 0
	return func(op Op, path string) *Fault {
		f := r(op, path)
		if f == nil {
			return nil
		}
		mu.Lock()
		defer mu.Unlock()
		seen++
		if seen <= n {
			return nil
		}
		return f
	}
}

// Once returns a rule that fires r's first fault only.
func Once(r Rule) Rule {
	var mu sync.Mutex
	fired := false
	return func(op Op, path string) *Fault {
		f := r(op, path)
		if f == nil {
			return nil
		}
		mu.Lock()
		defer mu.Unlock()
		if fired {
			return nil
		}
		fired = true
		return f
	}
}

// Injector is a vfs.FS that injects faults chosen by a Rule into another FS.
// It is safe for concurrent use.
type Injector struct {
	fs vfs.FS

	mu       sync.Mutex
	rule     Rule
	crashed  bool
	injected int
}

// NewInjector wraps fs; rule may be nil (no faults until SetRule).
func NewInjector(fs vfs.FS, rule Rule) *Injector { return &Injector{fs: fs, rule: rule} }

// SetRule replaces the rule (nil stops injecting). It does not revive a
// crashed injector.
func (in *Injector) SetRule(r Rule) {
	in.mu.Lock()
	in.rule = r
	in.mu.Unlock()
}

// Crashed reports whether a Crash fault fired.
func (in *Injector) Crashed() bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.crashed
}

// Injected returns the number of faults fired so far.
func (in *Injector) Injected() int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.injected
}

// check returns the fault for op, with crashed injectors failing
// everything. A non-nil error means "fail now without doing the op".
func (in *Injector) check(op Op, path string) (*Fault, error) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.crashed {
		return nil, &iofs.PathError{Op: op.String(), Path: path, Err: ErrCrashed}
	}
	if in.rule == nil {
		return nil, nil
	}
	f := in.rule(op, path)
	if f == nil {
		return nil, nil
	}
	in.injected++
	if f.Delay > 0 {
		in.mu.Unlock()
		time.Sleep(f.Delay)
		in.mu.Lock()
		if !f.Crash && !f.Short && f.Err == nil {
			return nil, nil
		}
	}
	if f.Crash {
		in.crashed = true
	}
	if f.Short && (op == OpRead || op == OpWrite) {
		return f, nil // the caller performs half of the transfer
	}
	err := f.Err
	if err == nil {
		err = ErrCrashed
	}
	return nil, &iofs.PathError{Op: op.String(), Path: path, Err: err}
}

func (in *Injector) wrap(f vfs.File, err error, name string) (vfs.File, error) {
	if err != nil {
		return nil, err
	}
	return &injectFile{f: f, in: in, name: name}, nil
}

// Create implements FS.
func (in *Injector) Create(name string) (vfs.File, error) {
	if _, err := in.check(OpCreate, name); err != nil {
		return nil, err
	}
	f, err := in.fs.Create(name)
	return in.wrap(f, err, name)
}

// OpenFile implements FS.
func (in *Injector) OpenFile(name string, flag int, perm os.FileMode) (vfs.File, error) {
	op := OpOpen
	if flag&os.O_CREATE != 0 {
		op = OpCreate
	}
	if _, err := in.check(op, name); err != nil {
		return nil, err
	}
	f, err := in.fs.OpenFile(name, flag, perm)
	return in.wrap(f, err, name)
}

// Open implements FS.
func (in *Injector) Open(name string) (vfs.File, error) {
	if _, err := in.check(OpOpen, name); err != nil {
		return nil, err
	}
	f, err := in.fs.Open(name)
	return in.wrap(f, err, name)
}

// SyncFS implements vfs.SyncFS (as OpSync on dir) when the wrapped FS does,
// and fails with errors.ErrUnsupported otherwise.
func (in *Injector) SyncFS(dir string) error {
	if _, err := in.check(OpSync, dir); err != nil {
		return err
	}
	s, ok := in.fs.(vfs.SyncFS)
	if !ok {
		return &iofs.PathError{Op: "syncfs", Path: dir, Err: errors.ErrUnsupported}
	}
	return s.SyncFS(dir)
}

// Rename implements FS; the rule sees the old name.
func (in *Injector) Rename(oldname, newname string) error {
	if _, err := in.check(OpRename, oldname); err != nil {
		return err
	}
	return in.fs.Rename(oldname, newname)
}

// Remove implements FS.
func (in *Injector) Remove(name string) error {
	if _, err := in.check(OpRemove, name); err != nil {
		return err
	}
	return in.fs.Remove(name)
}

// Stat implements FS.
func (in *Injector) Stat(name string) (os.FileInfo, error) {
	if _, err := in.check(OpStat, name); err != nil {
		return nil, err
	}
	return in.fs.Stat(name)
}

// Mkdir implements FS.
func (in *Injector) Mkdir(dir string, perm os.FileMode) error {
	if _, err := in.check(OpMkdir, dir); err != nil {
		return err
	}
	return in.fs.Mkdir(dir, perm)
}

// MkdirAll implements FS.
func (in *Injector) MkdirAll(dir string, perm os.FileMode) error {
	if _, err := in.check(OpMkdir, dir); err != nil {
		return err
	}
	return in.fs.MkdirAll(dir, perm)
}

// ReadDir implements FS.
func (in *Injector) ReadDir(name string) ([]os.DirEntry, error) {
	if _, err := in.check(OpReadDir, name); err != nil {
		return nil, err
	}
	return in.fs.ReadDir(name)
}

// WalkDir implements FS; the rule is consulted once, for root.
func (in *Injector) WalkDir(root string, fn iofs.WalkDirFunc) error {
	if _, err := in.check(OpReadDir, root); err != nil {
		return err
	}
	return in.fs.WalkDir(root, fn)
}

type injectFile struct {
	f    vfs.File
	in   *Injector
	name string
}

func (f *injectFile) ReadAt(p []byte, off int64) (int, error) {
	fault, err := f.in.check(OpRead, f.name)
	if err != nil {
		return 0, err
	}
	if fault == nil {
		return f.f.ReadAt(p, off)
	}
	n, err := f.f.ReadAt(p[:len(p)/2], off)
	if err == nil {
		err = fault.Err
		if err == nil {
			err = io.EOF
		}
	}
	return n, err
}

func (f *injectFile) short(n int, err error, fault *Fault) (int, error) {
	if err == nil {
		err = fault.Err
		if err == nil {
			err = io.ErrShortWrite
		}
		err = &iofs.PathError{Op: "write", Path: f.name, Err: err}
	}
	return n, err
}

func (f *injectFile) WriteAt(p []byte, off int64) (int, error) {
	fault, err := f.in.check(OpWrite, f.name)
	if err != nil {
		return 0, err
	}
	if fault == nil {
		return f.f.WriteAt(p, off)
	}
	n, err := f.f.WriteAt(p[:len(p)/2], off)
	return f.short(n, err, fault)
}

func (f *injectFile) Write(p []byte) (int, error) {
	fault, err := f.in.check(OpWrite, f.name)
	if err != nil {
		return 0, err
	}
	if fault == nil {
		return f.f.Write(p)
	}
	n, err := f.f.Write(p[:len(p)/2])
	return f.short(n, err, fault)
}

func (f *injectFile) Sync() error {
	if _, err := f.in.check(OpSync, f.name); err != nil {
		return err
	}
	return f.f.Sync()
}

func (f *injectFile) Stat() (os.FileInfo, error) {
	if _, err := f.in.check(OpStat, f.name); err != nil {
		return nil, err
	}
	return f.f.Stat()
}

func (f *injectFile) Truncate(size int64) error {
	if _, err := f.in.check(OpTruncate, f.name); err != nil {
		return err
	}
	return f.f.Truncate(size)
}

func (f *injectFile) SetDirect(on bool) error {
	if _, err := f.in.check(OpSetDirect, f.name); err != nil {
		return err
	}
	return f.f.SetDirect(on)
}

// Close always releases the descriptor, even when a fault is injected or
// the injector crashed (a dead process's descriptors are closed too).
func (f *injectFile) Close() error {
	_, ferr := f.in.check(OpClose, f.name)
	err := f.f.Close()
	if ferr != nil {
		return ferr
	}
	return err
}
