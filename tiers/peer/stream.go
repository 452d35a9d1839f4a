package peer

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/zeebo/xxh3"

	"github.com/kvtier/kvtier/offload"
)

// The client side of a peer's block stream (server/stream.go has the
// protocol): blocks are read from the socket straight into their slots and
// checked against the peer's XXH3 before the job reports them loaded.

// maxIdleStreams bounds the idle stream connections kept per peer.
const maxIdleStreams = 4

// stream is one peer's block-stream endpoint and its idle connections.
type stream struct {
	mu      sync.Mutex
	addr    string // "" until learnt, or when the peer has none
	learnt  time.Time
	idle    []*streamConn
	tlsConf *tls.Config
}

type streamConn struct {
	c net.Conn
	r *bufio.Reader
	w *bufio.Writer
}

// relearnEvery is how often a peer without a usable stream is asked
// again.
const relearnEvery = 10 * time.Second

// streamAddr returns the peer's stream address, asking the peer's Stats
// when unknown; "" means use the API (GetBlocks).
func (t *Tier) streamAddr(ctx context.Context, p *peer) string {
	s := &p.stream
	s.mu.Lock()
	if s.addr != "" || time.Since(s.learnt) < relearnEvery {
		a := s.addr
		s.mu.Unlock()
		return a
	}
	s.learnt = time.Now()
	s.mu.Unlock()
	st, err := p.c.Stats(ctx)
	if err != nil || st.GetStreamAddr() == "" {
		return ""
	}
	// The stream listens on the API's host; keep the host we reach the
	// API by (the daemon may have bound a wildcard address).
	_, port, err := net.SplitHostPort(st.GetStreamAddr())
	host, _, herr := net.SplitHostPort(p.cfg.Addr)
	if err != nil || herr != nil {
		return ""
	}
	a := net.JoinHostPort(host, port)
	s.mu.Lock()
	s.addr = a
	s.mu.Unlock()
	return a
}

// forgetStream drops a stream that failed; the next loads use the API
// until it is learnt again.
func (p *peer) forgetStream() {
	s := &p.stream
	s.mu.Lock()
	defer s.mu.Unlock()
	s.addr = ""
	s.learnt = time.Now()
	for _, c := range s.idle {
		c.c.Close()
	}
	s.idle = nil
}

func (t *Tier) getStreamConn(ctx context.Context, p *peer, addr string) (*streamConn, error) {
	s := &p.stream
	s.mu.Lock()
	if n := len(s.idle); n > 0 {
		c := s.idle[n-1]
		s.idle = s.idle[:n-1]
		s.mu.Unlock()
		return c, nil
	}
	s.mu.Unlock()
	d := net.Dialer{Timeout: t.cfg.Timeout}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if s.tlsConf != nil {
		conf := s.tlsConf.Clone()
		if conf.ServerName == "" {
			conf.ServerName, _, _ = net.SplitHostPort(p.cfg.Addr)
		}
		tc := tls.Client(c, conf)
		_ = tc.SetDeadline(time.Now().Add(t.cfg.Timeout))
		if err := tc.HandshakeContext(ctx); err != nil {
			c.Close()
			return nil, err
		}
		c = tc
	}
	sc := &streamConn{c: c, r: bufio.NewReaderSize(c, 64<<10), w: bufio.NewWriterSize(c, 64<<10)}
	_ = c.SetDeadline(time.Now().Add(t.cfg.Timeout))
	sc.w.WriteString("KVBS\x01")
	writeField(sc.w, []byte(p.cfg.Token))
	writeField(sc.w, []byte(t.cfg.Namespace))
	var reply [5]byte
	err = sc.w.Flush()
	if err == nil {
		_, err = io.ReadFull(sc.r, reply[:])
	}
	if err != nil || string(reply[:4]) != "KVBS" || reply[4] != 0 {
		c.Close()
		if err == nil {
			err = errors.New("refused (token or namespace)")
		}
		return nil, fmt.Errorf("block stream hello: %w", err)
	}
	return sc, nil
}

func (p *peer) putStreamConn(c *streamConn) {
	s := &p.stream
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.idle) < maxIdleStreams && s.addr != "" {
		s.idle = append(s.idle, c)
		return
	}
	c.c.Close()
}

func writeField(w *bufio.Writer, b []byte) {
	var lb [2]byte
	binary.BigEndian.PutUint16(lb[:], uint16(len(b)))
	w.Write(lb[:])
	w.Write(b)
}

// streamLoad reads keys (job.Keys[idx]) over the block stream into their
// slots. ok[i] is set for the blocks that arrived whole and verified;
// gone lists the keys the peer did not have. A transport error fails the
// rest of the request and the connection.
func (t *Tier) streamLoad(ctx context.Context, p *peer, addr string, job *offload.Job, idx []int, ok []bool) (gone []offload.Key, err error) {
	sc, err := t.getStreamConn(ctx, p, addr)
	if err != nil {
		return nil, err
	}
	broken := true
	defer func() {
		if broken {
			sc.c.Close()
		} else {
			p.putStreamConn(sc)
		}
	}()
	deadline := time.Now().Add(t.cfg.Timeout)
	if d, has := ctx.Deadline(); has && d.Before(deadline) {
		deadline = d
	}
	_ = sc.c.SetDeadline(deadline)
	var nb [4]byte
	binary.BigEndian.PutUint32(nb[:], uint32(len(idx)))
	sc.w.Write(nb[:])
	for _, i := range idx {
		writeField(sc.w, []byte(job.Keys[i]))
	}
	if err := sc.w.Flush(); err != nil {
		return nil, err
	}
	var hdr [12]byte
	for _, i := range idx {
		k := job.Keys[i]
		found, err := sc.r.ReadByte()
		if err != nil {
			return gone, err
		}
		if found == 0 {
			gone = append(gone, k)
			continue
		}
		if _, err := io.ReadFull(sc.r, hdr[:]); err != nil {
			return gone, err
		}
		n := int64(binary.BigEndian.Uint32(hdr[:4]))
		sum := binary.BigEndian.Uint64(hdr[4:])
		slot, serr := job.Arena.Slot(job.Slots[i])
		if serr != nil || n != int64(len(slot)) {
			// Another block size (or a bad slot): skip its bytes, never
			// copy part of it.
			if _, err := io.CopyN(io.Discard, sc.r, n); err != nil {
				return gone, err
			}
			gone = append(gone, k)
			continue
		}
		if _, err := io.ReadFull(sc.r, slot); err != nil {
			return gone, err // the slot holds part of a block: not reported loaded
		}
		if xxh3.Hash(slot) != sum {
			p.corrupt.Add(1)
			gone = append(gone, k)
			continue
		}
		ok[i] = true
		p.served.Add(1)
	}
	broken = false
	return gone, nil
}
