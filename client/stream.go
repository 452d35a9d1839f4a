package client

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	kvtierv1 "github.com/kvtier/kvtier/api/kvtier/v1"
	"github.com/kvtier/kvtier/blockstream"
	"github.com/kvtier/kvtier/offload"
)

// A daemon's block stream (package blockstream has the protocol) moves
// primary blocks without the API's copies: each block is read from the
// socket straight into the caller's buffer and checked against the
// daemon's checksum before Get reports it.

// StreamOptions configure DialStream.
type StreamOptions struct {
	Token, Namespace string
	// TLS talks TLS to a daemon whose API serves it; ServerName defaults
	// to the dialled host.
	TLS *tls.Config
	// Timeout bounds the dial and hello (default 5s).
	Timeout time.Duration
}

// Stream is one connection to a daemon's block stream. It is not safe for
// concurrent use.
type Stream struct {
	c net.Conn
	r *bufio.Reader
	w *bufio.Writer
}

// StreamAddr returns the address of the daemon's block stream ("" when it
// has none), on the host this client reaches the daemon's TCP API by.
func (c *Client) StreamAddr(ctx context.Context, apiAddr string) (string, error) {
	st, err := c.Stats(ctx)
	if err != nil {
		return "", err
	}
	return streamAddrOf(st, apiAddr)
}

// streamAddrOf is StreamAddr from the daemon's stats.
func streamAddrOf(st *kvtierv1.StatsResponse, apiAddr string) (string, error) {
	if st.GetStreamAddr() == "" {
		return "", nil
	}
	_, port, err := net.SplitHostPort(st.GetStreamAddr())
	if err != nil {
		return "", fmt.Errorf("stream address %q: %w", st.GetStreamAddr(), err)
	}
	host, _, err := net.SplitHostPort(apiAddr)
	if err != nil {
		return "", fmt.Errorf("API address %q: %w", apiAddr, err)
	}
	return net.JoinHostPort(host, port), nil
}

// DialStream connects to the block stream at addr and says hello (token,
// namespace); a refusal is an error.
func DialStream(ctx context.Context, addr string, o StreamOptions) (*Stream, error) {
	if o.Timeout <= 0 {
		o.Timeout = 5 * time.Second
	}
	d := net.Dialer{Timeout: o.Timeout}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if o.TLS != nil {
		conf := o.TLS.Clone()
		if conf.ServerName == "" {
			conf.ServerName, _, _ = net.SplitHostPort(addr)
		}
		tc := tls.Client(c, conf)
		_ = tc.SetDeadline(time.Now().Add(o.Timeout))
		if err := tc.HandshakeContext(ctx); err != nil {
			c.Close()
			return nil, err
		}
		c = tc
	}
	s := &Stream{c: c, r: bufio.NewReaderSize(c, 64<<10), w: bufio.NewWriterSize(c, 64<<10)}
	_ = c.SetDeadline(time.Now().Add(o.Timeout))
	s.w.WriteString(blockstream.Magic)
	s.w.WriteByte(blockstream.Version)
	blockstream.WriteField(s.w, []byte(o.Token))
	blockstream.WriteField(s.w, []byte(o.Namespace))
	var reply [5]byte
	err = s.w.Flush()
	if err == nil {
		_, err = io.ReadFull(s.r, reply[:])
	}
	if err == nil && (string(reply[:4]) != blockstream.Magic || reply[4] != 0) {
		err = errors.New("refused (token or namespace)")
	}
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("block stream %s: %w", addr, err)
	}
	return s, nil
}

// Close closes the connection.
func (s *Stream) Close() error { return s.c.Close() }

// StreamResult is what Get did with one key.
type StreamResult uint8

const (
	// StreamGone: the daemon's primary does not hold the block.
	StreamGone StreamResult = iota
	// StreamLoaded: the block is in its buffer, whole and verified.
	StreamLoaded
	// StreamWrongSize: the block is not the buffer's size; the buffer is
	// untouched.
	StreamWrongSize
	// StreamCorrupt: the block failed its checksum; the buffer holds
	// garbage.
	StreamCorrupt
)

// Get reads keys from the daemon's primary, block i into dst(i), until
// deadline. A transport error ends the call (and the stream is then
// unusable); the results of the keys before it are valid.
func (s *Stream) Get(keys []offload.Key, dst func(i int) []byte, deadline time.Time) ([]StreamResult, error) {
	_ = s.c.SetDeadline(deadline)
	s.writeKeys(keys, 0)
	if err := s.w.Flush(); err != nil {
		return nil, err
	}
	return s.readBlocks(len(keys), func(i int, _ int64) []byte { return dst(i) })
}

// writeKeys buffers the opening of a request: its key count with flags,
// then its keys.
func (s *Stream) writeKeys(keys []offload.Key, flags uint32) {
	_ = blockstream.WriteU32(s.w, uint32(len(keys))|flags)
	for _, k := range keys {
		_ = blockstream.WriteField(s.w, []byte(k))
	}
}

// readBlocks reads the blocks of a get's reply, block i of n bytes into
// dst(i, n) (nil: dropped as the wrong size).
func (s *Stream) readBlocks(nkeys int, dst func(i int, n int64) []byte) ([]StreamResult, error) {
	res := make([]StreamResult, nkeys)
	var h blockstream.Summer
	for i := range res {
		found, err := s.r.ReadByte()
		if err != nil {
			return res[:i], err
		}
		if found == 0 {
			continue // StreamGone
		}
		n, err := blockstream.ReadLen(s.r, &h)
		if err != nil {
			return res[:i], err
		}
		buf := dst(i, n)
		if n != int64(len(buf)) {
			if err := blockstream.Skip(s.r, n); err != nil {
				return res[:i], err
			}
			res[i] = StreamWrongSize
			continue
		}
		// Straight from the socket into the buffer.
		whole, err := blockstream.ReadBody(s.r, buf, &h)
		if err != nil {
			return res[:i], err
		}
		res[i] = StreamLoaded
		if !whole {
			res[i] = StreamCorrupt
		}
	}
	return res, nil
}

// readReply reads the opening of the reply to a call with parameters:
// nil when it is done, the daemon's error (a gRPC status) when it failed.
// A transport error is returned as failed too: tell them apart with
// status.FromError.
func (s *Stream) readReply() (failed, err error) {
	b, err := s.r.ReadByte()
	if err != nil {
		return nil, err
	}
	switch b {
	case blockstream.ReplyDone:
		return nil, nil
	case blockstream.ReplyFailed:
		code, err := s.r.ReadByte()
		if err != nil {
			return nil, err
		}
		msg, err := blockstream.ReadField(s.r, 1<<16-1)
		if err != nil {
			return nil, err
		}
		return status.Error(codes.Code(code), string(msg)), nil
	}
	return nil, fmt.Errorf("block stream: reply byte %d", b)
}

// PutResult is what Put did with one block.
type PutResult uint8

const (
	// PutStored: the daemon's primary holds the block now.
	PutStored PutResult = blockstream.PutStored
	// PutPresent: the primary held the key already (or the call repeats
	// it); nothing was written.
	PutPresent PutResult = blockstream.PutPresent
	// PutRejected: the block arrived damaged or of the wrong size, or
	// the primary had no room, and was not stored.
	PutRejected PutResult = blockstream.PutRejected
)

// Put stores blocks in the daemon's primary (with its default filters)
// until deadline: each block goes from its buffer into the socket with
// its checksum, and from the socket into its reserved slot, where the
// daemon checks it before the block is visible. A transport error ends
// the call (and the stream is then unusable); the daemon then stores
// none of the call's blocks.
func (s *Stream) Put(blocks []Block, deadline time.Time) ([]PutResult, error) {
	res, _, err := s.put(blocks, deadline, 0, nil)
	return res, err
}

// Push is Put for a peer's tier pushing blocks to this daemon: the daemon
// stores them in its primary and its storage tiers only, never passing
// them on to its own peers.
func (s *Stream) Push(blocks []Block, deadline time.Time) ([]PutResult, error) {
	res, _, err := s.put(blocks, deadline, blockstream.PushFlag, nil)
	return res, err
}

// put sends a put request; with ParamsFlag in flags, params follow the
// keys and the reply may be the daemon's refusal (failed).
func (s *Stream) put(blocks []Block, deadline time.Time, flags uint32, params []byte) (res []PutResult, failed, err error) {
	_ = s.c.SetDeadline(deadline)
	keys := make([]offload.Key, len(blocks))
	for i, b := range blocks {
		keys[i] = b.Key
	}
	var metas [][]byte
	if flags&blockstream.ParamsFlag != 0 {
		for i, b := range blocks {
			if b.Meta == nil {
				continue
			}
			if metas == nil {
				metas = make([][]byte, len(blocks))
			}
			m, err := proto.Marshal(b.Meta)
			if err != nil {
				return nil, nil, &answerError{status.Errorf(codes.InvalidArgument, "blocks[%d]: metadata: %v", i, err)}
			}
			if len(m) > blockstream.MaxMeta {
				return nil, nil, &answerError{status.Errorf(codes.InvalidArgument, "blocks[%d]: metadata of %d bytes (at most %d)", i, len(m), blockstream.MaxMeta)}
			}
			metas[i] = m
		}
		if metas != nil {
			flags |= blockstream.MetaFlag
		}
	}
	s.writeKeys(keys, blockstream.PutFlag|flags)
	if flags&blockstream.ParamsFlag != 0 {
		_ = blockstream.WriteField(s.w, params)
	}
	for _, m := range metas {
		_ = blockstream.WriteU32(s.w, uint32(len(m)))
		_, _ = s.w.Write(m)
	}
	var h blockstream.Summer
	for _, b := range blocks {
		if err := blockstream.WriteBlock(s.w, b.Data, &h); err != nil {
			return nil, nil, err
		}
	}
	if err := s.w.Flush(); err != nil {
		return nil, nil, err
	}
	if flags&blockstream.ParamsFlag != 0 {
		if failed, err := s.readReply(); failed != nil || err != nil {
			return nil, failed, err
		}
	}
	st := make([]byte, len(blocks))
	if _, err := io.ReadFull(s.r, st); err != nil {
		return nil, nil, err
	}
	res = make([]PutResult, len(blocks))
	for i, b := range st {
		res[i] = PutResult(b)
		if res[i] < PutStored || res[i] > PutRejected {
			return nil, nil, fmt.Errorf("block stream: put status %d", b)
		}
	}
	return res, nil, nil
}

// getOpts is a get with GetBlocks' parameters: its reply has the lookup
// results and hits before the blocks.
func (s *Stream) getOpts(keys []offload.Key, params []byte, wait time.Duration, prefixOnly bool, deadline time.Time, dst func(i int, n int64) []byte) (results []kvtierv1.LookupResult, hits int, res []StreamResult, failed, err error) {
	_ = s.c.SetDeadline(deadline)
	s.writeKeys(keys, blockstream.ParamsFlag)
	_ = blockstream.WriteField(s.w, params)
	_ = blockstream.WriteU32(s.w, uint32(min(wait.Milliseconds(), math.MaxUint32)))
	prefix := byte(0)
	if prefixOnly {
		prefix = 1
	}
	_ = s.w.WriteByte(prefix)
	if err := s.w.Flush(); err != nil {
		return nil, 0, nil, nil, err
	}
	if failed, err := s.readReply(); failed != nil || err != nil {
		return nil, 0, nil, failed, err
	}
	h, err := blockstream.ReadU32(s.r)
	if err != nil {
		return nil, 0, nil, nil, err
	}
	rb := make([]byte, len(keys))
	if _, err := io.ReadFull(s.r, rb); err != nil {
		return nil, 0, nil, nil, err
	}
	results = make([]kvtierv1.LookupResult, len(keys))
	for i, b := range rb {
		results[i] = kvtierv1.LookupResult(b)
	}
	if int(h) > len(keys) {
		return nil, 0, nil, nil, fmt.Errorf("block stream: %d hits of %d keys", h, len(keys))
	}
	res, err = s.readBlocks(len(keys), dst)
	return results, int(h), res, nil, err
}
