package arena

import (
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/kvtier/kvtier/dirlock"
	"github.com/kvtier/kvtier/offload"
)

// Kind selects the backing memory of an arena.
type Kind string

// Arena kinds.
const (
	// Anonymous is private anonymous memory (the default).
	Anonymous Kind = "anonymous"
	// File is a shared file, created 0600 at Config.Path (use a tmpfs such
	// as /dev/shm) and mapped MAP_SHARED; another process can map it by
	// path. The file is removed by Close.
	File Kind = "file"
	// Memfd is an anonymous memory file (memfd_create) mapped MAP_SHARED;
	// another process can map it through the file descriptor (File()).
	Memfd Kind = "memfd"
)

// MaxSlots bounds the number of slots of one arena; slot indices must fit
// comfortably in an int32 for the primary tier's metadata.
const MaxSlots = 1 << 30

// Errors callers test for.
var (
	// ErrClosed is returned by Slot after Close.
	ErrClosed = errors.New("arena closed")
	// ErrInvalidSize reports a slot size, slot count or total size that
	// cannot describe an arena on this machine.
	ErrInvalidSize = errors.New("invalid arena size")
	// ErrInUse reports a file arena another process holds (a running
	// daemon): nothing of it was touched.
	ErrInUse = errors.New("arena in use by another process")
	// ErrNotArena reports an existing file at a file arena's path that no
	// kvtier daemon created: it is never truncated or removed.
	ErrNotArena = errors.New("file exists and is not a kvtier arena")
)

// Config describes an arena.
type Config struct {
	SlotSize int  // bytes per slot, > 0
	NumSlots int  // number of slots, 1..MaxSlots
	Kind     Kind // "" means Anonymous
	Path     string
}

// Arena is a slot arena. Its methods are safe for concurrent use; Close
// must not race with users of slot views.
type Arena struct {
	mem      []byte // never reassigned after New, so Slot needs no lock
	slotSize int
	numSlots int
	kind     Kind
	path     string
	file     *os.File
	lock     *dirlock.Lock // File arenas: the held lock file path + ".lock"
	closed   atomic.Bool
}

// New allocates and maps an arena. It fails with a clear error when the
// size is invalid or exceeds the machine's memory, when the backing file
// cannot be created, or when the memory cannot be reserved or mapped.
func New(cfg Config) (*Arena, error) {
	size, err := checkSize(cfg.SlotSize, cfg.NumSlots)
	if err != nil {
		return nil, err
	}
	kind := cfg.Kind
	if kind == "" {
		kind = Anonymous
	}
	a := &Arena{slotSize: cfg.SlotSize, numSlots: cfg.NumSlots, kind: kind}
	switch kind {
	case Anonymous:
		if cfg.Path != "" {
			return nil, fmt.Errorf("arena: path %q given for an anonymous arena", cfg.Path)
		}
		mem, err := unix.Mmap(-1, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
		if err != nil {
			return nil, fmt.Errorf("arena: map %d bytes of anonymous memory: %w", size, err)
		}
		// Transparent huge pages where the system leaves them to the
		// program (THP "madvise", a common default): fewer TLB misses on
		// every copy into and out of the slots — a block stream put into
		// this arena went from 0.56 to 0.69 of a plain TCP stream
		// (medians of nine rounds). The arena is sized to be filled, so
		// committing memory 2 MiB at a time costs nothing it would not
		// cost anyway. Only advice: a kernel without THP ignores it.
		_ = unix.Madvise(mem, unix.MADV_HUGEPAGE)
		a.mem = mem
		return a, nil
	case File:
		if cfg.Path == "" {
			return nil, fmt.Errorf("arena: kind %q needs a path", kind)
		}
		lock, err := lockArena(cfg.Path)
		if err != nil {
			return nil, err
		}
		f, err := createFile(cfg.Path, lock)
		if err != nil {
			unlockArena(lock, !lock.Created) // never remove a lock file we did not create
			return nil, err
		}
		a.file, a.path, a.lock = f, cfg.Path, lock
	case Memfd:
		if cfg.Path != "" {
			return nil, fmt.Errorf("arena: path %q given for a memfd arena", cfg.Path)
		}
		fd, err := unix.MemfdCreate("kvtier-arena", unix.MFD_CLOEXEC)
		if err != nil {
			return nil, fmt.Errorf("arena: memfd_create: %w", err)
		}
		a.file = os.NewFile(uintptr(fd), "memfd:kvtier-arena")
	default:
		return nil, fmt.Errorf("arena: unknown kind %q (want %s, %s or %s)", kind, Anonymous, File, Memfd)
	}
	if err := a.reserveAndMap(size); err != nil {
		a.file.Close()
		if a.path != "" {
			os.Remove(a.path)
			unlockArena(a.lock, false)
		}
		return nil, err
	}
	return a, nil
}

// Open maps an existing shared arena file created by another process (or
// by New with kind File) — the engine's side of a File arena, and what
// tests use to check that the memory really is shared.
func Open(path string, slotSize, numSlots int) (*Arena, error) {
	size, err := checkSize(slotSize, numSlots)
	if err != nil {
		return nil, err
	}
	// Symlinks are followed: /proc/PID/fd/N is how a memfd is reached.
	f, err := os.OpenFile(path, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("arena: open %s: %w", path, err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("arena: stat %s: %w", path, err)
	}
	if !fi.Mode().IsRegular() || fi.Size() < size {
		f.Close()
		return nil, fmt.Errorf("arena: %s: %w: file is %d bytes (%v), want at least %d", path, ErrInvalidSize, fi.Size(), fi.Mode().Type(), size)
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("arena: map %s (%d bytes): %w", path, size, err)
	}
	// The opener does not own the file: Close must not remove it.
	return &Arena{mem: mem, slotSize: slotSize, numSlots: numSlots, kind: File, file: f}, nil
}

func checkSize(slotSize, numSlots int) (int64, error) {
	if slotSize <= 0 {
		return 0, fmt.Errorf("arena: %w: slot size %d (want > 0)", ErrInvalidSize, slotSize)
	}
	if numSlots <= 0 || numSlots > MaxSlots {
		return 0, fmt.Errorf("arena: %w: %d slots (want 1..%d)", ErrInvalidSize, numSlots, MaxSlots)
	}
	if int64(slotSize) > math.MaxInt64/int64(numSlots) {
		return 0, fmt.Errorf("arena: %w: %d slots of %d bytes overflow", ErrInvalidSize, numSlots, slotSize)
	}
	size := int64(slotSize) * int64(numSlots)
	if size > math.MaxInt { // 32-bit platforms
		return 0, fmt.Errorf("arena: %w: %d bytes exceed the address space", ErrInvalidSize, size)
	}
	// An arena larger than RAM plus swap can never be backed; catching it
	// here gives a clear error instead of the OOM killer later (anonymous
	// memory is overcommitted and faults in lazily).
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err == nil {
		total := (uint64(si.Totalram) + uint64(si.Totalswap)) * uint64(si.Unit)
		if total > 0 && uint64(size) > total {
			return 0, fmt.Errorf("arena: %w: %d bytes exceed the machine's memory (%d bytes of RAM and swap)", ErrInvalidSize, size, total)
		}
	}
	return size, nil
}

// lockWhat is what a file arena's lock file names its holder: kept after
// the holder dies, it marks the arena as kvtier's, so that a later daemon
// may take over the arena of one that died, and only such an arena.
const lockWhat = "kvtier arena"

// lockArena takes the exclusive lock of the file arena at path, before
// anything else touches the path: the lock file path + ".lock", held for
// the arena's life. A lock another process holds fails with ErrInUse,
// having changed nothing.
func lockArena(path string) (*dirlock.Lock, error) {
	l, err := dirlock.AcquireFile(path+".lock", lockWhat)
	if errors.Is(err, dirlock.ErrLocked) {
		return nil, fmt.Errorf("arena: %s: %w (%v); stop that daemon, or give this one another primary.arena.path", path, ErrInUse, err)
	}
	if err != nil {
		return nil, fmt.Errorf("arena: %w", err)
	}
	return l, nil
}

// unlockArena releases the lock of the arena at path, removing its lock
// file unless keep: a lock file this process did not create is never
// removed when the arena fails.
func unlockArena(l *dirlock.Lock, keep bool) {
	if keep {
		l.Release()
		return
	}
	l.ReleaseAndRemove()
}

// createFile creates (or takes over the stale arena of a daemon that died)
// the arena file, readable only by this user; the caller holds its lock.
// An existing file is taken over only if the lock file already carried
// the kvtier marker; any other file fails with ErrNotArena, untouched.
// Symlinks are refused so that a planted link cannot redirect the arena
// onto another file.
func createFile(path string, lock *dirlock.Lock) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if errors.Is(err, os.ErrExist) {
		if !strings.HasPrefix(lock.Previous, lockWhat+"\n") {
			return nil, fmt.Errorf("arena: %s: %w: refusing to overwrite it; remove it yourself, or set primary.arena.path to a new file", path, ErrNotArena)
		}
		// The arena of a kvtier daemon that died without cleaning up.
		f, err = os.OpenFile(path, os.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		return nil, fmt.Errorf("arena: create %s: %w", path, err)
	}

	fi, err := f.Stat()
	if err == nil && !fi.Mode().IsRegular() {
		err = fmt.Errorf("not a regular file (%v)", fi.Mode().Type())
	}
	if err == nil {
		err = f.Chmod(0o600) // a stale file may have wider permissions
	}
	if err == nil {
		err = f.Truncate(0) // drop stale contents; the arena starts zeroed
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("arena: create %s: %w", path, err)
	}
	return f, nil
}

// reserveAndMap sizes the backing file, reserving its pages so that a full
// tmpfs is reported now, and maps it shared.
func (a *Arena) reserveAndMap(size int64) error {
	fd := int(a.file.Fd())
	if err := unix.Fallocate(fd, 0, 0, size); err != nil {
		if !errors.Is(err, unix.EOPNOTSUPP) && !errors.Is(err, unix.ENOSYS) {
			return fmt.Errorf("arena: reserve %d bytes for %s: %w", size, a.describe(), err)
		}
		if err := unix.Ftruncate(fd, size); err != nil {
			return fmt.Errorf("arena: size %s to %d bytes: %w", a.describe(), size, err)
		}
	}
	mem, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fmt.Errorf("arena: map %s (%d bytes): %w", a.describe(), size, err)
	}
	a.mem = mem
	return nil
}

func (a *Arena) describe() string {
	if a.path != "" {
		return a.path
	}
	return string(a.kind)
}

// SlotSize returns the size of one slot in bytes.
func (a *Arena) SlotSize() int { return a.slotSize }

// NumSlots returns the number of slots.
func (a *Arena) NumSlots() int { return a.numSlots }

// Size returns the arena size in bytes.
func (a *Arena) Size() int64 { return int64(a.slotSize) * int64(a.numSlots) }

// Kind returns the backing kind.
func (a *Arena) Kind() Kind { return a.kind }

// Path returns the backing file path of a File arena, "" otherwise.
func (a *Arena) Path() string { return a.path }

// File returns the backing file of a File or Memfd arena (nil for an
// anonymous one), e.g. to pass its descriptor to an engine. The arena
// keeps ownership: do not close it.
func (a *Arena) File() *os.File { return a.file }

// Slot returns the bytes of slot i, a view into the arena (no copy) whose
// capacity ends at the slot boundary. It fails with an error wrapping
// offload.ErrSlotOutOfRange for an index outside the arena, or ErrClosed.
func (a *Arena) Slot(i int64) ([]byte, error) {
	if a.closed.Load() {
		return nil, fmt.Errorf("arena: slot %d: %w", i, ErrClosed)
	}
	if i < 0 || i >= int64(a.numSlots) {
		return nil, fmt.Errorf("arena: slot %d of %d: %w", i, a.numSlots, offload.ErrSlotOutOfRange)
	}
	off := int(i) * a.slotSize
	return a.mem[off : off+a.slotSize : off+a.slotSize], nil
}

// Close unmaps the memory, closes the backing file and removes it if this
// arena created it. Views handed out before must no longer be used.
// Close is idempotent.
func (a *Arena) Close() error {
	if a.closed.Swap(true) {
		return nil
	}
	var errs []error
	if err := unix.Munmap(a.mem); err != nil {
		errs = append(errs, fmt.Errorf("arena: unmap: %w", err))
	}
	if a.file != nil {
		if err := a.file.Close(); err != nil {
			errs = append(errs, fmt.Errorf("arena: close %s: %w", a.describe(), err))
		}
	}
	if a.path != "" && a.lock != nil {
		if err := os.Remove(a.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("arena: remove %s: %w", a.path, err))
		}
		unlockArena(a.lock, false)
	}
	return errors.Join(errs...)
}

var _ offload.Arena = (*Arena)(nil)
