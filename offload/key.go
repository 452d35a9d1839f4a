package offload

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// GroupSuffixLen is the length of the big-endian KV-group index appended to
// the engine's block hash to form a Key.
const GroupSuffixLen = 4

// MaxKeyLen bounds the length of a key accepted from outside (the API, a
// file name, an object name). Engine hashes are 8–32 bytes; 1 KiB leaves
// room for anything sane and keeps per-key metadata bounded.
const MaxKeyLen = 1024

// ErrInvalidKey reports a key that is too short to carry a group index or
// longer than MaxKeyLen.
var ErrInvalidKey = errors.New("invalid offload key")

// Key identifies one offloaded chunk: the engine's opaque block hash bytes
// followed by a 4-byte big-endian KV-group index (docs/semantics.md §1.1). kvtier never
// recomputes hashes. Key is a string so that it can be used as a map key
// without allocation and is immutable once built.
type Key string

// MakeKey builds the Key of block hash h in KV group group.
func MakeKey(h []byte, group uint32) Key {
	b := make([]byte, len(h)+GroupSuffixLen)
	copy(b, h)
	binary.BigEndian.PutUint32(b[len(h):], group)
	return Key(b)
}

// KeyFromBytes validates b as an encoded key (hash || be32(group)).
func KeyFromBytes(b []byte) (Key, error) {
	if len(b) <= GroupSuffixLen || len(b) > MaxKeyLen {
		return "", fmt.Errorf("%w: length %d (want %d..%d bytes)", ErrInvalidKey, len(b), GroupSuffixLen+1, MaxKeyLen)
	}
	return Key(b), nil
}

// Valid reports whether k has a non-empty hash and a group suffix and is at
// most MaxKeyLen bytes long.
func (k Key) Valid() bool { return len(k) > GroupSuffixLen && len(k) <= MaxKeyLen }

// Hash returns the engine block hash part of k (without the group index).
// It returns "" for an invalid key.
func (k Key) Hash() string {
	if len(k) < GroupSuffixLen {
		return ""
	}
	return string(k[:len(k)-GroupSuffixLen])
}

// Group returns the KV-group index of k, or 0 for an invalid key.
func (k Key) Group() uint32 {
	if len(k) < GroupSuffixLen {
		return 0
	}
	n := len(k)
	return uint32(k[n-4])<<24 | uint32(k[n-3])<<16 | uint32(k[n-2])<<8 | uint32(k[n-1])
}

// WireHash is the hash as vLLM publishes it in KV events when integer block
// hashes are on: the block hash read as a big-endian integer with only the
// low 64 bits kept, i.e. its last 8 bytes (left-padded with zeros when the
// hash is shorter).
func (k Key) WireHash() uint64 { return WireHash(k.Hash()) }

// WireHash returns the low 64 bits of the big-endian integer value of h.
func WireHash(h string) uint64 {
	if n := len(h); n >= 8 {
		// The common case (hashes of 8 bytes or more), unrolled: it is on
		// the lookup path of the peer tier's index.
		h = h[n-8:]
		return uint64(h[0])<<56 | uint64(h[1])<<48 | uint64(h[2])<<40 | uint64(h[3])<<32 |
			uint64(h[4])<<24 | uint64(h[5])<<16 | uint64(h[6])<<8 | uint64(h[7])
	}
	var v uint64
	for i := 0; i < len(h); i++ {
		v = v<<8 | uint64(h[i])
	}
	return v
}

// HexHash returns the lowercase hex of the hash part, the form used in file
// and object names.
func (k Key) HexHash() string { return hex.EncodeToString([]byte(k.Hash())) }

// String renders k for logs and tools: the hex of all its bytes (the
// engine hash followed by the 4-byte big-endian group), the form
// ParseKey and `kvtier get KEY` accept.
func (k Key) String() string { return hex.EncodeToString([]byte(k)) }

// ParseKey parses a key written as String writes it (hex of the full key
// bytes), or as "HASHHEX/gN" (hex of the hash, decimal group).
func ParseKey(s string) (Key, error) {
	if h, g, ok := strings.Cut(s, "/g"); ok {
		raw, err := hex.DecodeString(h)
		if err != nil {
			return "", fmt.Errorf("key %q: hash is not hex: %w", s, err)
		}
		n, err := strconv.ParseUint(g, 10, 32)
		if err != nil {
			return "", fmt.Errorf("key %q: group %q is not a 32-bit number", s, g)
		}
		k := MakeKey(raw, uint32(n))
		if !k.Valid() {
			return "", fmt.Errorf("key %q: want 1 to %d hash bytes", s, MaxKeyLen-GroupSuffixLen)
		}
		return k, nil
	}
	raw, err := hex.DecodeString(s)
	if err != nil {
		return "", fmt.Errorf("key %q is not hex (want the hex of the engine hash bytes followed by the 4-byte big-endian group): %w", s, err)
	}
	k := Key(raw)
	if !k.Valid() {
		return "", fmt.Errorf("key %q is %d bytes: want %d to %d (engine hash bytes followed by the 4-byte group)", s, len(raw), GroupSuffixLen+1, MaxKeyLen)
	}
	return k, nil
}
