package fs

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"

	"github.com/zeebo/xxh3"

	"github.com/kvtier/kvtier/offload"
)

// Format is the on-disk block format.
type Format uint8

// Formats.
const (
	// FormatKVTier is the block followed by a checksummed trailer.
	FormatKVTier Format = iota
	// FormatVLLM is vLLM's raw layout: the block's bytes only.
	FormatVLLM
)

// String returns the configuration name.
func (f Format) String() string {
	if f == FormatVLLM {
		return "vllm"
	}
	return "kvtier"
}

// ParseFormat maps "kvtier" (or "") and "vllm", case-insensitively.
func ParseFormat(s string) (Format, error) {
	switch strings.ToLower(s) {
	case "", "kvtier":
		return FormatKVTier, nil
	case "vllm":
		return FormatVLLM, nil
	}
	return 0, fmt.Errorf("format %q: want kvtier or vllm", s)
}

const (
	trailerLen     = 24
	trailerMagic   = "KVTB"
	trailerVersion = 1
	algXXH3Seeded  = 1
)

// Errors a load distinguishes: corrupt files are deleted, foreign ones
// are left alone.
var (
	// ErrCorrupt reports a block file that failed verification (wrong
	// length, bad trailer or checksum). The file is deleted.
	ErrCorrupt = errors.New("corrupt block file")
	// ErrForeignFormat reports a file in the other format (a raw vLLM
	// block where a trailer is expected). It is refused, not deleted.
	ErrForeignFormat = errors.New("block file in another format")
)

// fileSize is the size of the file of a block of n bytes.
func (f Format) fileSize(n int) int64 {
	if f == FormatVLLM {
		return int64(n)
	}
	return int64(n) + trailerLen
}

// checksum of a block's payload, seeded by its key so that a file renamed
// to another key's name fails too.
func checksum(k offload.Key, payload []byte) uint64 {
	return xxh3.HashSeed(payload, xxh3.HashString(string(k)))
}

// putTrailer writes the trailer of payload into t (len ≥ trailerLen).
func putTrailer(t []byte, k offload.Key, payload []byte) {
	putTrailerSum(t, len(payload), checksum(k, payload))
}

// putTrailerSum writes the trailer of an n-byte payload whose checksum
// is sum into t (len ≥ trailerLen).
func putTrailerSum(t []byte, n int, sum uint64) {
	copy(t[0:4], trailerMagic)
	binary.LittleEndian.PutUint16(t[4:6], trailerVersion)
	binary.LittleEndian.PutUint16(t[6:8], algXXH3Seeded)
	binary.LittleEndian.PutUint64(t[8:16], uint64(n))
	binary.LittleEndian.PutUint64(t[16:24], sum)
}

// verifyTrailer checks t against payload.
func verifyTrailer(t []byte, k offload.Key, payload []byte) error {
	if len(t) != trailerLen || string(t[0:4]) != trailerMagic {
		return fmt.Errorf("%w: bad trailer magic", ErrCorrupt)
	}
	if v := binary.LittleEndian.Uint16(t[4:6]); v != trailerVersion {
		return fmt.Errorf("%w: trailer version %d", ErrCorrupt, v)
	}
	if a := binary.LittleEndian.Uint16(t[6:8]); a != algXXH3Seeded {
		return fmt.Errorf("%w: checksum algorithm %d", ErrCorrupt, a)
	}
	if n := binary.LittleEndian.Uint64(t[8:16]); n != uint64(len(payload)) {
		return fmt.Errorf("%w: trailer length %d, block is %d bytes", ErrCorrupt, n, len(payload))
	}
	if want, got := binary.LittleEndian.Uint64(t[16:24]), checksum(k, payload); want != got {
		return fmt.Errorf("%w: checksum %016x, want %016x", ErrCorrupt, got, want)
	}
	return nil
}
