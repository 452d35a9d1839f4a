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
// ParamsFlag in the key count marks a by-value call of a remote engine
// (the client's GetBlocks and PutBlocks): the keys are followed by u16 len
// params, the request's kv_transfer_params JSON, and for a get by u32
// wait in milliseconds and u8 prefix-only (0/1). The reply to such a call
// opens with u8 0 (done) or 1 (failed: u8 code, a gRPC status code, and a
// u16-len message follow, and nothing else; a failed put's blocks are read
// and dropped first). A get that is done is answered as the API's
// GetBlocks: u32 hits, per key u8 lookup result (the API's LookupResult
// numbers), then the blocks as above for the keys the call returns.
//
// MetaFlag marks a by-value put (with ParamsFlag) whose blocks carry token
// metadata for self-describing KV events: after the parameters, per key u32
// len and len bytes of the API's BlockMetadata message in protobuf (len 0:
// none for that block), at most MaxMeta bytes each.
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
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"net"

	"github.com/zeebo/xxh3"
)

const (
	// Magic and Version open both hellos.
	Magic   = "KVBS"
	Version = 1
	// PutFlag marks a put request in its key count; PushFlag a put that
	// is a peer's push.
	PutFlag    = 1 << 31
	PushFlag   = 1 << 30
	ParamsFlag = 1 << 29
	MetaFlag   = 1 << 28
	// Flags are the bits of the key count that are not the count.
	Flags = PutFlag | PushFlag | ParamsFlag | MetaFlag
	// MaxMeta bounds one block's metadata on the stream (a chunk of
	// 2^18 tokens, vLLM's largest, encodes in under 2 MiB).
	MaxMeta = 4 << 20
	// Chunk is the unit a put is written, read and hashed in.
	Chunk = 256 << 10
)

// Put statuses, one byte per key of a put response.
const (
	PutStored   = 1 // stored into the primary
	PutPresent  = 2 // the primary holds the key already (or it repeats one)
	PutRejected = 3 // wrong size or checksum, or no room: not stored
)

// Summer computes the checksum of a block on the stream: the XXH3-64 of
// the big-endian XXH3-64s of the block's Chunk-sized pieces. (One-shot
// XXH3 per piece is twice as fast as the streaming hasher.) The zero value
// is ready; one Summer serves the blocks of a call in turn.
type Summer struct {
	sums []byte
	word [8]byte // framing scratch of WriteBlock and ReadBody
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

// WriteBlock writes data as the stream frames a block: u32 length, the
// bytes Chunk at a time (a bufio.Writer passes each straight to the
// socket), each hashed right after, then their Sum.
func WriteBlock(w io.Writer, data []byte, s *Summer) error {
	binary.BigEndian.PutUint32(s.word[:4], uint32(len(data)))
	if _, err := w.Write(s.word[:4]); err != nil {
		return err
	}
	s.Reset()
	for off := 0; off < len(data); off += Chunk {
		piece := data[off:min(off+Chunk, len(data))]
		if _, err := w.Write(piece); err != nil {
			return err
		}
		s.Write(piece)
	}
	binary.BigEndian.PutUint64(s.word[:], s.Sum64())
	_, err := w.Write(s.word[:])
	return err
}

// WriteBlockSummed writes a found block of a get response (the found
// byte, then the block as WriteBlock frames it) whose Sum is known already
// (it arrived on the stream, or was sent before): what w holds is flushed,
// then the framing and data go to c, the connection under w, in one
// vectored write (writev on a TCP connection), with nothing hashed or
// copied in user space.
func WriteBlockSummed(w *bufio.Writer, c io.Writer, data []byte, sum uint64) error {
	if err := w.Flush(); err != nil {
		return err
	}
	var head [5]byte
	var tail [8]byte
	head[0] = 1
	binary.BigEndian.PutUint32(head[1:], uint32(len(data)))
	binary.BigEndian.PutUint64(tail[:], sum)
	bufs := net.Buffers{head[:], data, tail[:]}
	_, err := bufs.WriteTo(c)
	return err
}

// ReadLen reads the length that opens a block.
func ReadLen(r io.Reader, s *Summer) (int64, error) {
	if _, err := io.ReadFull(r, s.word[:4]); err != nil {
		return 0, err
	}
	return int64(binary.BigEndian.Uint32(s.word[:4])), nil
}

// ReadBody reads a block of len(dst) bytes (its length read) into dst,
// Chunk at a time, each hashed right after it landed, then its Sum, and
// reports whether they match; when they do not, dst holds garbage.
func ReadBody(r io.Reader, dst []byte, s *Summer) (bool, error) {
	s.Reset()
	for off := 0; off < len(dst); off += Chunk {
		piece := dst[off:min(off+Chunk, len(dst))]
		if _, err := io.ReadFull(r, piece); err != nil {
			return false, err
		}
		s.Write(piece)
	}
	if _, err := io.ReadFull(r, s.word[:]); err != nil {
		return false, err
	}
	return s.Sum64() == binary.BigEndian.Uint64(s.word[:]), nil
}

// Reply openings of a call with ParamsFlag.
const (
	ReplyDone   = 0
	ReplyFailed = 1
)

// Skip reads and drops a block of n bytes (its length read) and its Sum:
// one of another size is never copied in part.
func Skip(r io.Reader, n int64) error {
	_, err := io.CopyN(io.Discard, r, n+8)
	return err
}

// WriteField writes a u16-length-prefixed field (a key, a token, a
// namespace).
func WriteField(w io.Writer, b []byte) error {
	var lb [2]byte
	binary.BigEndian.PutUint16(lb[:], uint16(len(b)))
	if _, err := w.Write(lb[:]); err != nil {
		return err
	}
	_, err := w.Write(b)
	return err
}

// WriteU32 writes a big-endian u32.
func WriteU32(w io.Writer, v uint32) error {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], v)
	_, err := w.Write(b[:])
	return err
}

// ReadU32 reads a big-endian u32.
func ReadU32(r io.Reader) (uint32, error) {
	var b [4]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return 0, err
	}
	return binary.BigEndian.Uint32(b[:]), nil
}

// ReadField reads a field WriteField wrote, refusing one over max bytes.
func ReadField(r io.Reader, max int) ([]byte, error) {
	var lb [2]byte
	if _, err := io.ReadFull(r, lb[:]); err != nil {
		return nil, err
	}
	n := int(binary.BigEndian.Uint16(lb[:]))
	if n > max {
		return nil, fmt.Errorf("block stream: %d-byte field (max %d)", n, max)
	}
	b := make([]byte, n)
	_, err := io.ReadFull(r, b)
	return b, err
}
