package client

import (
	"context"
	"sync"
	"time"
)

// maxIdleStreams bounds the stream connections a pool keeps between calls
// (one per concurrent caller is dialled on demand).
const maxIdleStreams = 4

// streamRetryAfter is how long a pool leaves the stream alone after it
// could not be dialled, failed, or the daemon had none: the callers use
// the API meanwhile (a port the network does not pass would otherwise
// cost every call a dial timeout), then the address is learnt again.
const streamRetryAfter = 10 * time.Second

// StreamPool keeps a Client's connections to its daemon's block stream:
// it learns the stream's address and the namespace's slot size from the
// daemon's Stats, dials on demand, keeps a few idle connections, and
// after a failure leaves the stream alone for a while. The by-value calls
// use it, and so does the peer tier for its loads and pushes. It is safe
// for concurrent use; a Stream it hands out serves one caller at a time.
type StreamPool struct {
	c       *Client
	apiAddr string
	opts    StreamOptions
	// set holds the pools of one connection's clients (one per namespace,
	// WithNamespace): closing the connection closes them all.
	set *poolSet

	mu       sync.Mutex
	probed   bool
	addr     string // "" when the daemon has no stream
	slotSize int
	idle     []*Stream
	closed   bool
	// retryAt is when to try the stream again after a failure.
	retryAt time.Time
}

// Streams returns the client's block-stream pool: nil for a client of a
// Unix socket or one dialled with Options.NoStream (a nil pool's Take
// returns nil).
func (c *Client) Streams() *StreamPool { return c.streams }

// Take returns an idle or newly dialled stream and the namespace's slot
// size, or nil when the caller should use the API: the daemon has no
// stream, it failed lately, or the pool is closed.
func (p *StreamPool) Take(ctx context.Context) (*Stream, int) {
	if p == nil {
		return nil, 0
	}
	p.mu.Lock()
	if p.closed || time.Now().Before(p.retryAt) {
		p.mu.Unlock()
		return nil, 0
	}
	if !p.probed {
		p.mu.Unlock()
		st, err := p.c.Stats(ctx)
		if err != nil {
			return nil, 0 // the API call reports it
		}
		addr, err := streamAddrOf(st, p.apiAddr)
		p.mu.Lock()
		if err != nil || addr == "" {
			// No stream (yet): ask again after the delay, as the daemon
			// may be restarted with one.
			p.retryAt = time.Now().Add(streamRetryAfter)
			p.mu.Unlock()
			return nil, 0
		}
		p.probed, p.addr, p.slotSize = true, addr, int(st.GetPrimary().GetSlotSize())
	}
	addr, size := p.addr, p.slotSize
	if n := len(p.idle); n > 0 {
		s := p.idle[n-1]
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		return s, size
	}
	p.mu.Unlock()
	s, err := DialStream(ctx, addr, p.opts)
	if err != nil {
		// The daemon may have restarted on another stream port, or the
		// network may not pass it.
		p.Forget()
		return nil, 0
	}
	return s, size
}

// Give returns a stream after a call it answered in full.
func (p *StreamPool) Give(s *Stream) {
	if p == nil {
		s.Close()
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || !p.probed || len(p.idle) >= maxIdleStreams {
		s.Close()
		return
	}
	p.idle = append(p.idle, s)
}

// Forget closes the idle streams and leaves the stream alone for a while:
// a stream failed in a way that may recur (the daemon restarted, the
// network), so its address is learnt again before the next use.
func (p *StreamPool) Forget() {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.probed, p.retryAt = false, time.Now().Add(streamRetryAfter)
	for _, s := range p.idle {
		s.Close()
	}
	p.idle = nil
}

// poolSet is the stream pools of the clients sharing one connection.
type poolSet struct {
	mu    sync.Mutex
	pools []*StreamPool
}

func newStreamPool(c *Client, apiAddr string, opts StreamOptions, set *poolSet) *StreamPool {
	if set == nil {
		set = &poolSet{}
	}
	p := &StreamPool{c: c, apiAddr: apiAddr, opts: opts, set: set}
	set.mu.Lock()
	set.pools = append(set.pools, p)
	set.mu.Unlock()
	return p
}

// closeAll closes every pool of the set.
func (s *poolSet) closeAll() {
	s.mu.Lock()
	pools := s.pools
	s.mu.Unlock()
	for _, p := range pools {
		p.close()
	}
}

func (p *StreamPool) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for _, s := range p.idle {
		s.Close()
	}
	p.idle = nil
}
