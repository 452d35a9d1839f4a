package zmtp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvtier/kvtier/ratelog"
)

// PubOptions configures a PubSocket. Zero values select the defaults.
type PubOptions struct {
	// HWM bounds each subscriber's queue, in messages (default 1000, as
	// libzmq). A full queue drops its oldest message.
	HWM int
	// HandshakeTimeout bounds the greeting and READY exchange (default 10 s).
	HandshakeTimeout time.Duration
	// ReconnectInterval is the first delay before redialling a connect
	// endpoint (default 100 ms); it doubles up to ReconnectIntervalMax
	// (default 5 s).
	ReconnectInterval    time.Duration
	ReconnectIntervalMax time.Duration
	// Linger bounds how long Close waits, after sending a subscriber
	// everything queued for it, for the subscriber to close its side
	// (default 1 s). Closing first could turn a pending inbound segment
	// into a reset that discards data still in flight.
	Linger time.Duration
	// MaxConns bounds the connections of a bound socket, subscribers and
	// handshakes in progress (default 256); one beyond it is closed at
	// once, so a flood of idle connections cannot use up the process's
	// file descriptors.
	MaxConns int
	Logger   *slog.Logger
}

// DefaultMaxConns is the default bound on a bound socket's connections.
const DefaultMaxConns = 256

func (o *PubOptions) defaults() {
	if o.MaxConns <= 0 {
		o.MaxConns = DefaultMaxConns
	}
	if o.HWM <= 0 {
		o.HWM = 1000
	}
	if o.HandshakeTimeout <= 0 {
		o.HandshakeTimeout = 10 * time.Second
	}
	if o.ReconnectInterval <= 0 {
		o.ReconnectInterval = 100 * time.Millisecond
	}
	if o.ReconnectIntervalMax < o.ReconnectInterval {
		o.ReconnectIntervalMax = max(5*time.Second, o.ReconnectInterval)
	}
	if o.Linger <= 0 {
		o.Linger = time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

// pubMaxFrame bounds frames from subscribers: they only send subscriptions.
const pubMaxFrame = 64 << 10

// maxSubscriptions bounds the distinct topic prefixes of one subscriber.
const maxSubscriptions = 1024

// PeerStats describes one connected subscriber.
type PeerStats struct {
	Remote        string
	Subscriptions int
	Queued        int
	Sent          uint64
	Dropped       uint64 // dropped because its queue was full
}

// PubStats are a PubSocket's counters. Sent and Dropped include
// subscribers that have gone.
type PubStats struct {
	Peers   []PeerStats
	Sent    uint64
	Dropped uint64
}

// PubSocket is a ZMQ PUB socket. Every subscriber has its own bounded queue
// and writer goroutine: Send never blocks, and a subscriber that stops
// reading loses only its own messages.
type PubSocket struct {
	opts PubOptions
	log  *slog.Logger
	// refusals logs refused connections at most once per interval, with
	// a count: a flood of connections must not flood the log.
	refusals ratelog.Limiter
	ctx      context.Context // canceled when Close starts: stops dials and handshakes
	cancel   context.CancelFunc
	abort    chan struct{} // closed when Close gives up draining
	wg       sync.WaitGroup

	mu        sync.RWMutex
	closed    bool
	listeners []net.Listener
	pending   map[net.Conn]struct{} // handshaking
	peers     []*peer
	goneSent  uint64
	goneDrop  uint64
	refused   atomic.Uint64
}

// NewPub returns a PUB socket with no endpoints.
func NewPub(opts PubOptions) *PubSocket {
	opts.defaults()
	ctx, cancel := context.WithCancel(context.Background())
	return &PubSocket{
		opts:    opts,
		log:     opts.Logger,
		ctx:     ctx,
		cancel:  cancel,
		abort:   make(chan struct{}),
		pending: make(map[net.Conn]struct{}),
	}
}

// Bind listens on endpoint (tcp://host:port or ipc://path) and returns the
// bound address (with the port chosen for tcp port 0).
func (p *PubSocket) Bind(endpoint string) (net.Addr, error) {
	ln, err := listen(endpoint)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		ln.Close()
		return nil, ErrClosed
	}
	p.listeners = append(p.listeners, ln)
	p.wg.Add(1)
	go p.acceptLoop(ln)
	return ln.Addr(), nil
}

// Connect dials endpoint in the background and keeps redialling while the
// socket is open, like zmq_connect.
func (p *PubSocket) Connect(endpoint string) error {
	if _, _, err := ParseEndpoint(endpoint); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrClosed
	}
	p.wg.Add(1)
	go p.dialLoop(endpoint)
	return nil
}

func (p *PubSocket) acceptLoop(ln net.Listener) {
	defer p.wg.Done()
	var pause acceptPause
	for {
		nc, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) || p.ctx.Err() != nil {
				return
			}
			if !pause.wait(p.ctx, p.log, "zmtp pub", err) {
				return
			}
			continue
		}
		pause.ok()
		p.mu.Lock()
		full := len(p.pending)+len(p.peers) >= p.opts.MaxConns
		p.mu.Unlock()
		if full {
			nc.Close()
			p.refused.Add(1)
			p.refusals.Warn(p.log, "max_conns", "zmtp pub: connection refused: too many connections", "max", p.opts.MaxConns, "remote", nc.RemoteAddr(), "refused_total", p.refused.Load())
			continue
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.serve(nc)
		}()
	}
}

// Refused returns the connections refused because MaxConns was reached.
func (p *PubSocket) Refused() uint64 { return p.refused.Load() }

func (p *PubSocket) dialLoop(endpoint string) {
	defer p.wg.Done()
	backoff := p.opts.ReconnectInterval
	for p.ctx.Err() == nil {
		nc, err := dial(p.ctx, endpoint)
		if err == nil {
			if p.serve(nc) {
				backoff = p.opts.ReconnectInterval
			}
		} else {
			p.log.Debug("zmtp pub: connect", "endpoint", endpoint, "err", err)
		}
		select {
		case <-p.ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, p.opts.ReconnectIntervalMax)
	}
}

// serve runs one connection until it ends and reports whether the
// handshake succeeded.
func (p *PubSocket) serve(nc net.Conn) bool {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		nc.Close()
		return false
	}
	p.pending[nc] = struct{}{}
	p.mu.Unlock()

	ctx, cancel := context.WithTimeout(p.ctx, p.opts.HandshakeTimeout)
	c, err := Handshake(ctx, nc, Pub, nil, pubMaxFrame)
	cancel()
	if err != nil {
		p.mu.Lock()
		delete(p.pending, nc)
		p.mu.Unlock()
		nc.Close()
		p.log.Debug("zmtp pub: handshake", "remote", nc.RemoteAddr(), "err", err)
		return false
	}
	pe := &peer{
		c:          c,
		remote:     nc.RemoteAddr().String(),
		hwm:        p.opts.HWM,
		subs:       make(map[string]int),
		wake:       make(chan struct{}, 1),
		readDone:   make(chan struct{}),
		writerDone: make(chan struct{}),
	}
	p.mu.Lock()
	delete(p.pending, nc)
	if p.closed {
		p.mu.Unlock()
		nc.Close()
		return true
	}
	p.peers = append(p.peers, pe)
	p.mu.Unlock()
	p.log.Debug("zmtp pub: subscriber connected", "remote", pe.remote, "type", c.PeerType())

	go pe.writeLoop(p)
	err = pe.readLoop()
	close(pe.readDone)
	pe.mu.Lock()
	draining := pe.draining
	pe.dead = true
	pe.mu.Unlock()
	pe.notify()
	if !draining {
		nc.Close() // unblock a writer stuck on a peer that went away
	}
	<-pe.writerDone
	nc.Close()

	p.mu.Lock()
	for i, q := range p.peers {
		if q == pe {
			p.peers = append(p.peers[:i], p.peers[i+1:]...)
			break
		}
	}
	p.goneSent += pe.sent.Load()
	p.goneDrop += pe.dropped.Load()
	p.mu.Unlock()
	if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
		p.log.Debug("zmtp pub: subscriber gone", "remote", pe.remote, "err", err)
	}
	return true
}

// Send queues a multipart message for every subscriber whose subscription
// is a prefix of its first frame. It never blocks. The frames must not be
// modified afterwards: they are shared by all subscriber queues.
func (p *PubSocket) Send(frames [][]byte) {
	var topic []byte
	if len(frames) > 0 {
		topic = frames[0]
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	for _, pe := range p.peers {
		pe.offer(topic, frames)
	}
}

// Stats returns the socket's counters.
func (p *PubSocket) Stats() PubStats {
	p.mu.RLock()
	defer p.mu.RUnlock()
	s := PubStats{Sent: p.goneSent, Dropped: p.goneDrop}
	for _, pe := range p.peers {
		ps := pe.stats()
		s.Peers = append(s.Peers, ps)
		s.Sent += ps.Sent
		s.Dropped += ps.Dropped
	}
	return s
}

// Close stops accepting and connecting, sends every subscriber what is
// queued for it, and closes. When ctx ends first the remaining connections
// are closed at once and the error says how many messages were left.
func (p *PubSocket) Close(ctx context.Context) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	for _, ln := range p.listeners {
		ln.Close()
	}
	peers := append([]*peer(nil), p.peers...)
	p.mu.Unlock()
	p.cancel()
	for _, pe := range peers {
		pe.mu.Lock()
		pe.draining = true
		pe.mu.Unlock()
		pe.notify()
	}
	done := make(chan struct{})
	go func() {
		p.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
	}
	close(p.abort)
	undelivered := 0
	p.mu.Lock()
	for nc := range p.pending {
		nc.Close()
	}
	for _, pe := range p.peers {
		pe.mu.Lock()
		undelivered += pe.q.n
		pe.dead = true
		pe.mu.Unlock()
		pe.notify()
		pe.c.Close()
	}
	p.mu.Unlock()
	<-done
	return fmt.Errorf("zmtp: pub close: %d queued messages undelivered: %w", undelivered, ctx.Err())
}

// peer is one subscriber connection.
type peer struct {
	c      *Conn
	remote string
	hwm    int

	mu       sync.Mutex
	subs     map[string]int // prefix → subscribe count, as libzmq's trie
	q        ring
	ctrl     []Command
	draining bool
	dead     bool

	wake       chan struct{}
	readDone   chan struct{}
	writerDone chan struct{}
	sent       atomic.Uint64
	dropped    atomic.Uint64
}

func (pe *peer) notify() {
	select {
	case pe.wake <- struct{}{}:
	default:
	}
}

func (pe *peer) offer(topic []byte, frames [][]byte) {
	pe.mu.Lock()
	if pe.dead || !pe.matchLocked(topic) {
		pe.mu.Unlock()
		return
	}
	if pe.q.n >= pe.hwm {
		pe.q.pop()
		pe.dropped.Add(1)
	}
	pe.q.push(frames, pe.hwm)
	pe.mu.Unlock()
	pe.notify()
}

func (pe *peer) matchLocked(topic []byte) bool {
	for s := range pe.subs {
		if len(s) <= len(topic) && string(topic[:len(s)]) == s {
			return true
		}
	}
	return false
}

func (pe *peer) stats() PeerStats {
	pe.mu.Lock()
	defer pe.mu.Unlock()
	return PeerStats{
		Remote:        pe.remote,
		Subscriptions: len(pe.subs),
		Queued:        pe.q.n,
		Sent:          pe.sent.Load(),
		Dropped:       pe.dropped.Load(),
	}
}

func (pe *peer) subscribe(topic []byte, on bool) {
	pe.mu.Lock()
	defer pe.mu.Unlock()
	t := string(topic)
	if !on {
		if n := pe.subs[t]; n > 1 {
			pe.subs[t] = n - 1
		} else {
			delete(pe.subs, t)
		}
		return
	}
	if _, ok := pe.subs[t]; !ok && len(pe.subs) >= maxSubscriptions {
		return
	}
	pe.subs[t]++
}

// readLoop handles, until the connection fails, what a subscriber sends: subscriptions in the ZMTP 3.0
// message form (0x01/0x00 + topic) or the 3.1 SUBSCRIBE/CANCEL commands,
// and PING. Anything else is ignored, as libzmq's PUB does.
func (pe *peer) readLoop() error {
	for {
		msg, cmd, err := pe.c.Read()
		if err != nil {
			return err
		}
		switch cmd.Name {
		case "":
			if len(msg) == 1 && len(msg[0]) > 0 && msg[0][0] <= 1 {
				pe.subscribe(msg[0][1:], msg[0][0] == 1)
			}
		case "SUBSCRIBE":
			pe.subscribe(cmd.Data, true)
		case "CANCEL":
			pe.subscribe(cmd.Data, false)
		case "PING":
			pe.mu.Lock()
			if len(pe.ctrl) < 8 {
				pe.ctrl = append(pe.ctrl, Command{Name: "PONG", Data: pong(cmd.Data)})
			}
			pe.mu.Unlock()
			pe.notify()
		}
	}
}

func (pe *peer) writeLoop(p *PubSocket) {
	defer close(pe.writerDone)
	nc := pe.c.NetConn()
	var batch [][][]byte
	for {
		pe.mu.Lock()
		for pe.q.n == 0 && len(pe.ctrl) == 0 && !pe.dead && !pe.draining {
			pe.mu.Unlock()
			<-pe.wake
			pe.mu.Lock()
		}
		batch = pe.q.drain(batch[:0])
		ctrl := pe.ctrl
		pe.ctrl = nil
		dead, draining := pe.dead, pe.draining
		pe.mu.Unlock()
		if dead {
			return
		}
		var err error
		for _, c := range ctrl {
			if err == nil {
				err = pe.c.WriteCommand(c.Name, c.Data)
			}
		}
		for _, m := range batch {
			if err == nil {
				err = pe.c.WriteMessage(m)
			}
		}
		if err == nil && (len(batch) > 0 || len(ctrl) > 0) {
			err = pe.c.Flush()
		}
		n := len(batch)
		clear(batch)
		if err != nil {
			pe.mu.Lock()
			pe.dead = true
			pe.mu.Unlock()
			nc.Close()
			return
		}
		pe.sent.Add(uint64(n))
		if draining && n == 0 && len(ctrl) == 0 {
			// Everything queued is written: end our half of the stream and
			// give the subscriber a moment to read it and close its side.
			if cw, ok := nc.(interface{ CloseWrite() error }); ok {
				_ = cw.CloseWrite()
			}
			t := time.NewTimer(p.opts.Linger)
			select {
			case <-pe.readDone:
			case <-t.C:
			case <-p.abort:
			}
			t.Stop()
			nc.Close()
			return
		}
	}
}

// ring is a FIFO of messages that grows on demand up to its limit.
type ring struct {
	buf  [][][]byte
	head int
	n    int
}

func (r *ring) push(m [][]byte, limit int) {
	if r.n == len(r.buf) {
		nb := make([][][]byte, min(max(16, 2*len(r.buf)), max(limit, 1)))
		for i := 0; i < r.n; i++ {
			nb[i] = r.buf[(r.head+i)%len(r.buf)]
		}
		r.buf, r.head = nb, 0
	}
	r.buf[(r.head+r.n)%len(r.buf)] = m
	r.n++
}

func (r *ring) pop() {
	r.buf[r.head] = nil
	r.head = (r.head + 1) % len(r.buf)
	r.n--
}

// drain moves every queued message to dst in order.
func (r *ring) drain(dst [][][]byte) [][][]byte {
	for r.n > 0 {
		dst = append(dst, r.buf[r.head])
		r.pop()
	}
	return dst
}
