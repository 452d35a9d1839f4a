package remote

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/zeebo/xxh3"

	"github.com/kvtier/kvtier/offload"
)

// HeaderSize is the size of the envelope header that precedes every
// stored block.
const HeaderSize = 32

const (
	envelopeVersion = 1
	magic           = "KVTB"
)

// ErrCorrupt reports a stored block that failed verification: bad magic,
// wrong key, truncated, or a checksum mismatch. Callers delete such a block
// and count it.
var ErrCorrupt = errors.New("corrupt block")

// ErrSizeMismatch reports a well-formed block whose payload length differs
// from the slot it should be loaded into: written under another block
// geometry. It is a miss but not corruption, so the block is kept.
var ErrSizeMismatch = errors.New("block size differs from slot size")

// Header is a parsed envelope header.
type Header struct {
	Len uint64 // payload length in bytes
	Sum uint64 // XXH3-64 of the payload
}

// PutHeader writes the envelope header of payload, stored under key, into
// h, which must hold at least HeaderSize bytes.
func PutHeader(h []byte, key offload.Key, payload []byte) {
	_ = h[HeaderSize-1]
	copy(h[0:4], magic)
	h[4] = envelopeVersion
	h[5], h[6], h[7] = 0, 0, 0
	binary.BigEndian.PutUint64(h[8:16], uint64(len(payload)))
	binary.BigEndian.PutUint64(h[16:24], xxh3.Hash(payload))
	binary.BigEndian.PutUint64(h[24:32], xxh3.HashString(string(key)))
}

// Seal returns a new buffer holding the envelope of payload: header then
// payload. dst is reused when it has the capacity.
func Seal(dst []byte, key offload.Key, payload []byte) []byte {
	n := HeaderSize + len(payload)
	if cap(dst) < n {
		dst = make([]byte, n)
	}
	dst = dst[:n]
	PutHeader(dst, key, payload)
	copy(dst[HeaderSize:], payload)
	return dst
}

// ParseHeader checks the fixed fields of header h (at least HeaderSize
// bytes) for a block read under key and returns the length and checksum
// it announces. Errors wrap ErrCorrupt.
func ParseHeader(h []byte, key offload.Key) (Header, error) {
	if len(h) < HeaderSize {
		return Header{}, fmt.Errorf("%w: %d-byte header, want %d", ErrCorrupt, len(h), HeaderSize)
	}
	if string(h[0:4]) != magic {
		return Header{}, fmt.Errorf("%w: bad magic %q", ErrCorrupt, h[0:4])
	}
	if h[4] != envelopeVersion {
		return Header{}, fmt.Errorf("%w: unknown envelope version %d", ErrCorrupt, h[4])
	}
	if h[5]|h[6]|h[7] != 0 {
		return Header{}, fmt.Errorf("%w: reserved header bytes set", ErrCorrupt)
	}
	if binary.BigEndian.Uint64(h[24:32]) != xxh3.HashString(string(key)) {
		return Header{}, fmt.Errorf("%w: block belongs to another key", ErrCorrupt)
	}
	return Header{
		Len: binary.BigEndian.Uint64(h[8:16]),
		Sum: binary.BigEndian.Uint64(h[16:24]),
	}, nil
}

// CheckLen reports whether a payload of the announced length fits a slot
// of slotSize bytes (ErrSizeMismatch otherwise).
func (h Header) CheckLen(slotSize int) error {
	if h.Len != uint64(slotSize) {
		return fmt.Errorf("%w: stored %d bytes, slot %d", ErrSizeMismatch, h.Len, slotSize)
	}
	return nil
}

// Verify checks payload against the header's length and checksum. Errors
// wrap ErrCorrupt.
func (h Header) Verify(payload []byte) error {
	if uint64(len(payload)) != h.Len {
		return fmt.Errorf("%w: %d payload bytes, header says %d", ErrCorrupt, len(payload), h.Len)
	}
	if xxh3.Hash(payload) != h.Sum {
		return fmt.Errorf("%w: checksum mismatch", ErrCorrupt)
	}
	return nil
}

// OpenString verifies value, an envelope read under key, and copies its
// payload into dst, whose length is the slot size. Nothing is copied
// unless the whole value verifies, so dst never holds a bad block. The
// string form lets a client's reply be checked without another copy.
func OpenString(key offload.Key, value string, dst []byte) error {
	if len(value) < HeaderSize {
		return fmt.Errorf("%w: %d-byte value is shorter than the header", ErrCorrupt, len(value))
	}
	var hb [HeaderSize]byte
	copy(hb[:], value)
	h, err := ParseHeader(hb[:], key)
	if err != nil {
		return err
	}
	payload := value[HeaderSize:]
	if uint64(len(payload)) != h.Len {
		return fmt.Errorf("%w: %d payload bytes, header says %d", ErrCorrupt, len(payload), h.Len)
	}
	if err := h.CheckLen(len(dst)); err != nil {
		return err
	}
	if xxh3.HashString(payload) != h.Sum {
		return fmt.Errorf("%w: checksum mismatch", ErrCorrupt)
	}
	copy(dst, payload)
	return nil
}

// Parallel runs fn(0) … fn(n-1) on up to GOMAXPROCS goroutines (the
// caller's included) and returns when all have. For per-block CPU work
// (sealing, verifying) of a multi-block job.
func Parallel(n int, fn func(i int)) {
	workers := min(n, runtime.GOMAXPROCS(0))
	if workers <= 1 {
		for i := range n {
			fn(i)
		}
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	work := func() {
		for {
			i := int(next.Add(1) - 1)
			if i >= n {
				return
			}
			fn(i)
		}
	}
	for range workers - 1 {
		wg.Go(work)
	}
	work()
	wg.Wait()
}
