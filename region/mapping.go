package region

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/kvtier/kvtier/offload"
)

// mapping is an engine's region mapped into the daemon: an offload.Arena
// of the layout's rows.
type mapping struct {
	mem    []byte
	stride int
	n      int
}

// mapRegion maps f, which must be exactly l.Size() bytes, shared and
// writable (promotions write into it).
func mapRegion(f *os.File, l Layout) (*mapping, error) {
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("region: stat the descriptor: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%w: the descriptor is not a regular file (%v)", ErrLayout, fi.Mode())
	}
	if fi.Size() != l.Size() {
		return nil, fmt.Errorf("%w: the region file is %d bytes, the layout says %d blocks of %d bytes = %d", ErrLayout, fi.Size(), l.NumBlocks, l.RowStride, l.Size())
	}
	if int64(int(l.Size())) != l.Size() {
		return nil, fmt.Errorf("%w: %d bytes do not fit this platform's address space", ErrLayout, l.Size())
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, int(l.Size()), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("region: map %d bytes: %w", l.Size(), err)
	}
	return &mapping{mem: mem, stride: l.RowStride, n: l.NumBlocks}, nil
}

func (m *mapping) SlotSize() int { return m.stride }
func (m *mapping) NumSlots() int { return m.n }

func (m *mapping) Slot(i int64) ([]byte, error) {
	if i < 0 || i >= int64(m.n) {
		return nil, fmt.Errorf("region slot %d of %d: %w", i, m.n, offload.ErrSlotOutOfRange)
	}
	off := int(i) * m.stride
	return m.mem[off : off+m.stride : off+m.stride], nil
}

// unmap releases the mapping; no transfer may use it any more.
func (m *mapping) unmap() error {
	if m.mem == nil {
		return nil
	}
	err := unix.Munmap(m.mem)
	m.mem = nil
	return err
}
