// Package blockstream holds what both ends of kvtier's block stream share
// (server/stream.go serves it, client/stream.go speaks it): the framing
// constants and the checksum of a put.
//
// Protocol (integers big-endian):
//
//	client hello:  "KVBS" u8 version(1) u16 len token u16 len namespace
//	server hello:  "KVBS" u8 status (0 ok, 1 refused) — then the
//	               connection closes if refused
//	get request:   u32 nkeys, then per key u16 len, key bytes
//	get response:  per key u8 found (0/1) and, when found, u32 len,
//	               len bytes, u64 Sum of the bytes
//	put request:   u32 nkeys | PutFlag [| PushFlag], then per key u16 len, key bytes,
//	               then per key u32 len, len bytes, u64 Sum of the bytes
//	put response:  per key u8 status (PutStored, PutPresent, PutRejected)
//
// PushFlag marks a put as a push from a peer's tier: the daemon stores
// the blocks in its primary and lets them cascade to its storage tiers
// only, never to its own peers, so a push never travels further.
//
// A block's checksum trails it and is computed Chunk bytes at a time, so
// that both ends hash each chunk right after it went through the socket,
// while it is still in cache.
package blockstream

import (
	"encoding/binary"

	"github.com/zeebo/xxh3"
)

const (
	// Magic and Version open both hellos.
	Magic   = "KVBS"
	Version = 1
	// PutFlag marks a put request in its key count; PushFlag a put that
	// is a peer's push.
	PutFlag  = 1 << 31
	PushFlag = 1 << 30
	// Chunk is the unit a put is written, read and hashed in.
	Chunk = 256 << 10
)

// Put statuses, one byte per key of a put response.
const (
	PutStored   = 1 // stored into the primary
	PutPresent  = 2 // the primary holds the key already (or it repeats one)
	PutRejected = 3 // wrong size or checksum, or no room: not stored
)

// Summer computes the checksum of a block on the stream: the XXH3-64 of the big-endian
// XXH3-64s of the block's Chunk-sized pieces. (One-shot XXH3 per piece is
// twice as fast as the streaming hasher.) The zero value is ready.
type Summer struct {
	sums []byte
}

// Reset starts a new block.
func (s *Summer) Reset() { s.sums = s.sums[:0] }

// Write adds the next piece, at most Chunk bytes; every piece but the
// last must be exactly Chunk bytes.
func (s *Summer) Write(piece []byte) {
	s.sums = binary.BigEndian.AppendUint64(s.sums, xxh3.Hash(piece))
}

// Sum64 returns the block's checksum.
func (s *Summer) Sum64() uint64 { return xxh3.Hash(s.sums) }

// Sum is the checksum of a whole block.
func Sum(block []byte) uint64 {
	var s Summer
	for off := 0; off < len(block); off += Chunk {
		s.Write(block[off:min(off+Chunk, len(block))])
	}
	return s.Sum64()
}
