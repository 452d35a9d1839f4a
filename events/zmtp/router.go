package zmtp

import (
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/kvtier/kvtier/ratelog"
)

// Handler answers one request received by a RouterSocket. id is the
// peer's routing id (its Identity property, or one generated as libzmq
// does); msg holds the frames after it. reply buffers a message for that
// peer (the routing id is implicit); once it returns an error the peer is
// gone and the handler should stop. Replies are flushed when the handler
// returns. Handlers of different peers run concurrently.
type Handler func(id []byte, msg [][]byte, reply func(frames ...[]byte) error)

// RouterOptions configures a RouterSocket.
type RouterOptions struct {
	HandshakeTimeout time.Duration // default 10 s
	MaxFrame         int64         // inbound frame limit, default 64 KiB
	// WriteTimeout bounds each write of a reply (default 10 s): a client
	// that stops reading is disconnected rather than holding its handler,
	// and what the handler replies with, forever. A long replay to a slow
	// client that keeps reading is not cut short.
	WriteTimeout time.Duration
	// IdleTimeout closes a connection that sends nothing for this long
	// (default 60 s): a replay client asks and reads, it does not sit.
	IdleTimeout time.Duration
	// MaxConns bounds the connections (default DefaultMaxConns); one
	// beyond it is closed at once.
	MaxConns int
	Logger   *slog.Logger
}

// RouterSocket is a ZMQ ROUTER socket that hands each inbound message to a
// Handler and writes the replies on the connection it came from.
type RouterSocket struct {
	h    Handler
	opts RouterOptions
	// refusals logs refused connections at most once per interval.
	refusals ratelog.Limiter
	ctx      context.Context
	cancel   context.CancelFunc
	wg       sync.WaitGroup

	mu        sync.Mutex
	closed    bool
	nextID    uint32
	listeners []net.Listener
	conns     map[net.Conn]struct{}
}

// NewRouter returns a ROUTER socket answering with h.
func NewRouter(h Handler, opts RouterOptions) *RouterSocket {
	if opts.HandshakeTimeout <= 0 {
		opts.HandshakeTimeout = 10 * time.Second
	}
	if opts.IdleTimeout <= 0 {
		opts.IdleTimeout = time.Minute
	}
	if opts.MaxConns <= 0 {
		opts.MaxConns = DefaultMaxConns
	}
	if opts.MaxFrame <= 0 {
		opts.MaxFrame = 64 << 10
	}
	if opts.WriteTimeout <= 0 {
		opts.WriteTimeout = 10 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &RouterSocket{h: h, opts: opts, ctx: ctx, cancel: cancel, conns: make(map[net.Conn]struct{})}
}

// Bind listens on endpoint and returns the bound address.
func (r *RouterSocket) Bind(endpoint string) (net.Addr, error) {
	ln, err := listen(endpoint)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		ln.Close()
		return nil, ErrClosed
	}
	r.listeners = append(r.listeners, ln)
	r.wg.Add(1)
	go r.acceptLoop(ln)
	return ln.Addr(), nil
}

func (r *RouterSocket) acceptLoop(ln net.Listener) {
	defer r.wg.Done()
	var pause acceptPause
	for {
		nc, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) || r.ctx.Err() != nil {
				return
			}
			if !pause.wait(r.ctx, r.opts.Logger, "zmtp router", err) {
				return
			}
			continue
		}
		pause.ok()
		r.mu.Lock()
		if r.closed || len(r.conns) >= r.opts.MaxConns {
			full := !r.closed
			r.mu.Unlock()
			nc.Close()
			if full {
				r.refusals.Warn(r.opts.Logger, "max_conns", "zmtp router: connection refused: too many connections", "max", r.opts.MaxConns, "remote", nc.RemoteAddr())
			}
			continue
		}
		r.conns[nc] = struct{}{}
		r.nextID++
		id := r.nextID
		r.mu.Unlock()
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			r.serve(nc, id)
			r.mu.Lock()
			delete(r.conns, nc)
			r.mu.Unlock()
			nc.Close()
		}()
	}
}

func (r *RouterSocket) serve(nc net.Conn, seq uint32) {
	ctx, cancel := context.WithTimeout(r.ctx, r.opts.HandshakeTimeout)
	c, err := Handshake(ctx, nc, Router, nil, r.opts.MaxFrame)
	cancel()
	if err != nil {
		r.opts.Logger.Debug("zmtp router: handshake", "remote", nc.RemoteAddr(), "err", err)
		return
	}
	id := c.PeerIdentity()
	if len(id) == 0 || id[0] == 0 {
		// libzmq reserves ids starting with 0 for generated ones.
		id = binary.BigEndian.AppendUint32([]byte{0}, seq)
	}
	// Every write gets a fresh deadline: a client must keep reading, not
	// read a whole replay within one timeout.
	progress := func() { _ = nc.SetWriteDeadline(time.Now().Add(r.opts.WriteTimeout)) }
	var werr error
	reply := func(frames ...[]byte) error {
		if werr == nil {
			progress()
			werr = c.WriteMessage(frames)
		}
		return werr
	}
	for {
		_ = nc.SetReadDeadline(time.Now().Add(r.opts.IdleTimeout))
		msg, cmd, err := c.Read()
		if err != nil {
			return
		}
		if cmd.Name == "PING" {
			progress()
			werr = c.WriteCommand("PONG", pong(cmd.Data))
		} else if cmd.Name == "" {
			r.h(id, msg, reply)
		}
		if werr == nil {
			progress()
			werr = c.Flush()
		}
		if werr != nil {
			r.opts.Logger.Debug("zmtp router: write", "remote", nc.RemoteAddr(), "err", werr)
			return
		}
	}
}

// Close stops accepting, closes every connection and waits for the
// handlers to return.
func (r *RouterSocket) Close() error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	for _, ln := range r.listeners {
		ln.Close()
	}
	for nc := range r.conns {
		nc.Close()
	}
	r.mu.Unlock()
	r.cancel()
	r.wg.Wait()
	return nil
}
