package remote

import (
	"errors"
	"io"
)

// Body is an io.ReadSeeker over an envelope header followed by a payload,
// without copying either: an HTTP client can sign, send and, on a retry,
// rewind it.
type Body struct {
	head, payload []byte
	off           int64
}

// NewBody returns a reader over head then payload.
func NewBody(head, payload []byte) *Body { return &Body{head: head, payload: payload} }

// Len returns the total length in bytes.
func (b *Body) Len() int64 { return int64(len(b.head) + len(b.payload)) }

// Read implements io.Reader.
func (b *Body) Read(p []byte) (int, error) {
	if b.off >= b.Len() {
		return 0, io.EOF
	}
	n := 0
	if h := int64(len(b.head)); b.off < h {
		n = copy(p, b.head[b.off:])
	}
	if n < len(p) {
		start := b.off + int64(n) - int64(len(b.head))
		n += copy(p[n:], b.payload[start:])
	}
	b.off += int64(n)
	return n, nil
}

// Seek implements io.Seeker.
func (b *Body) Seek(offset int64, whence int) (int64, error) {
	var abs int64
	switch whence {
	case io.SeekStart:
		abs = offset
	case io.SeekCurrent:
		abs = b.off + offset
	case io.SeekEnd:
		abs = b.Len() + offset
	default:
		return 0, errors.New("remote: body seek: invalid whence")
	}
	if abs < 0 {
		return 0, errors.New("remote: body seek: negative position")
	}
	b.off = abs
	return abs, nil
}
