package slotpipe

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// ErrClosed reports a call on closed Pools.
var ErrClosed = errors.New("slotpipe: closed")

// Options configure connections to every server of a Pools.
type Options struct {
	Username, Password string // AUTH on dial when Password is set
	DB                 int    // SELECT on dial when not 0
	// TLS, when set, is negotiated on every connection; an empty
	// ServerName checks the host dialled.
	TLS *tls.Config
	// DialTimeout bounds connecting and the login; Timeout bounds each
	// write and each read. Zero: no bound but the context's.
	DialTimeout, Timeout time.Duration
	// MaxIdle bounds the idle connections kept per server (default 4).
	MaxIdle int
	// Dial connects; nil uses a net.Dialer. Tests inject faults here.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

// Pools holds idle connections per server address.
type Pools struct {
	opts   Options
	mu     sync.Mutex
	idle   map[string][]*Conn
	closed bool
	// spills hold what Set copies for its background writes (*[]byte):
	// buffers live while a write is in flight, not per connection.
	spills sync.Pool
}

// New returns empty pools with opts.
func New(opts Options) *Pools {
	if opts.MaxIdle <= 0 {
		opts.MaxIdle = 4
	}
	if opts.Dial == nil {
		var d net.Dialer
		opts.Dial = d.DialContext
	}
	return &Pools{opts: opts, idle: map[string][]*Conn{}}
}

// Get returns an idle connection to addr or dials one.
func (p *Pools) Get(ctx context.Context, addr string) (*Conn, error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, ErrClosed
	}
	for l := p.idle[addr]; len(l) > 0; l = p.idle[addr] {
		c := l[len(l)-1]
		l[len(l)-1] = nil
		p.idle[addr] = l[:len(l)-1]
		if c.r.Buffered() == 0 && alive(c.nc) {
			p.mu.Unlock()
			return c, nil
		}
		c.nc.Close()
	}
	p.mu.Unlock()
	return p.dial(ctx, addr)
}

func (p *Pools) dial(ctx context.Context, addr string) (*Conn, error) {
	if p.opts.DialTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.opts.DialTimeout)
		defer cancel()
	}
	nc, err := p.opts.Dial(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	if p.opts.TLS != nil {
		cfg := p.opts.TLS
		if cfg.ServerName == "" {
			host, _, _ := net.SplitHostPort(addr)
			cfg = cfg.Clone()
			cfg.ServerName = host
		}
		tc := tls.Client(nc, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			nc.Close()
			return nil, fmt.Errorf("tls handshake with %s: %w", addr, err)
		}
		nc = tc
	}
	c := &Conn{pools: p, addr: addr, nc: nc, r: bufio.NewReaderSize(nc, MaxReplyLine)}
	if sc, ok := nc.(syscall.Conn); ok && canWriteNow && p.opts.TLS == nil {
		if rc, err := sc.SyscallConn(); err == nil {
			c.raw = rc
		}
	}
	var login [][]string
	switch {
	case p.opts.Password != "" && p.opts.Username != "":
		login = append(login, []string{"AUTH", p.opts.Username, p.opts.Password})
	case p.opts.Password != "":
		login = append(login, []string{"AUTH", p.opts.Password})
	}
	if p.opts.DB != 0 {
		login = append(login, []string{"SELECT", strconv.Itoa(p.opts.DB)})
	}
	if len(login) == 0 {
		return c, nil
	}
	var b []byte
	for _, args := range login {
		b = appendCommand(b, args...)
	}
	err = c.bounded(ctx, func() error {
		if _, err := nc.Write(b); err != nil {
			return err
		}
		c.sets = len(login)
		verdicts, err := c.readStatus()
		if err != nil {
			return err
		}
		return errors.Join(verdicts...)
	})
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("login to %s: %w", addr, err)
	}
	return c, nil
}

// spill returns a buffer from the pool with room for n bytes.
func (p *Pools) spill(n int) *[]byte {
	b, _ := p.spills.Get().(*[]byte)
	if b == nil {
		b = new([]byte)
	}
	if cap(*b) < n {
		*b = make([]byte, 0, n)
	}
	return b
}

// Close closes every idle connection; connections in use are closed when
// they come back.
func (p *Pools) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for addr, l := range p.idle {
		for _, c := range l {
			c.nc.Close()
		}
		delete(p.idle, addr)
	}
	return nil
}

func (p *Pools) put(c *Conn) {
	p.mu.Lock()
	if !p.closed && len(p.idle[c.addr]) < p.opts.MaxIdle {
		p.idle[c.addr] = append(p.idle[c.addr], c)
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	c.nc.Close()
}
