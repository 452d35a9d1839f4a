package server

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
)

// authGate bounds the API's TCP connections and keeps callers that have
// not authenticated from holding them. A connection is authenticated once
// one of its calls passed the tap check (tap), which runs on the
// call's headers, before gRPC reads its body: a caller without a valid
// token never has a request decoded, whatever it sends. A connection that
// has not authenticated within timeout is closed, and when the listener
// is at its limit a new connection closes the oldest one that has not
// authenticated yet, so that idle or PING-answering connections of
// strangers never lock out a client with a token. When every connection
// has authenticated, Accept waits for one to close, as
// netutil.LimitListener does.
type authGate struct {
	net.Listener
	limit   int
	perPeer int // connections from one host
	// refused reports a connection refused at once: its host is at
	// perPeer with every connection authenticated.
	refused func(host string)
	timeout time.Duration
	// closed reports a connection closed before it authenticated:
	// reason "timeout" or "evicted".
	closed func(reason string)

	// mu is read-locked by every authenticated call (authenticated) and
	// write-locked only by Accept, Close and a connection's release.
	mu      sync.RWMutex
	freed   *sync.Cond // a connection closed, or the listener did
	open    int
	conns   map[string]*gatedConn // by remote address
	byHost  map[string]int        // open connections by remote host
	seq     uint64
	closing bool
}

func newAuthGate(ln net.Listener, limit, perPeer int, timeout time.Duration, closed func(reason string), refused func(host string)) *authGate {
	if perPeer <= 0 || perPeer > limit {
		perPeer = limit
	}
	g := &authGate{Listener: ln, limit: max(limit, 1), perPeer: max(perPeer, 1), timeout: timeout, closed: closed, refused: refused,
		conns: map[string]*gatedConn{}, byHost: map[string]int{}}
	g.freed = sync.NewCond(&g.mu)
	return g
}

// gatedConn is one connection of an authGate.
type gatedConn struct {
	net.Conn
	g      *authGate
	key    string
	host   string
	seq    uint64 // accept order
	authed atomic.Bool
	// timer closes the connection at the auth timeout; set after the
	// timer starts, so read atomically (its own callback may run first).
	timer atomic.Pointer[time.Timer]
	once  sync.Once
}

// Accept returns the next connection once there is room for it.
func (g *authGate) Accept() (net.Conn, error) {
	for {
		c, err := g.Listener.Accept()
		if err != nil {
			return nil, err
		}
		host := hostOf(c.RemoteAddr())
		g.mu.Lock()
		// One host at its share makes room among its own connections
		// that have not authenticated, or is refused; never another's.
		for g.byHost[host] >= g.perPeer && !g.closing {
			v := g.oldestUnauthenticatedLocked(host)
			if v == nil {
				break
			}
			g.mu.Unlock()
			v.drop("evicted")
			g.mu.Lock()
		}
		if g.byHost[host] >= g.perPeer && !g.closing {
			g.mu.Unlock()
			c.Close()
			g.refused(host)
			continue
		}
		for g.open >= g.limit && !g.closing {
			if v := g.oldestUnauthenticatedLocked(""); v != nil {
				g.mu.Unlock()
				v.drop("evicted")
				g.mu.Lock()
				continue
			}
			g.freed.Wait()
		}
		if g.closing {
			g.mu.Unlock()
			c.Close()
			return nil, net.ErrClosed
		}
		g.open++
		g.byHost[host]++
		g.seq++
		gc := &gatedConn{Conn: c, g: g, key: c.RemoteAddr().String(), host: host, seq: g.seq}
		g.conns[gc.key] = gc
		g.mu.Unlock()
		if g.timeout > 0 {
			gc.timer.Store(time.AfterFunc(g.timeout, func() {
				if !gc.authed.Load() {
					gc.drop("timeout")
				}
			}))
		}
		return gc, nil
	}
}

// Close closes the listener and wakes an Accept waiting for room.
func (g *authGate) Close() error {
	g.mu.Lock()
	g.closing = true
	g.freed.Broadcast()
	g.mu.Unlock()
	return g.Listener.Close()
}

// oldestUnauthenticatedLocked returns the oldest connection that has not
// authenticated, of host ("" for any).
func (g *authGate) oldestUnauthenticatedLocked(host string) *gatedConn {
	var oldest *gatedConn
	for _, c := range g.conns {
		if !c.authed.Load() && (host == "" || c.host == host) && (oldest == nil || c.seq < oldest.seq) {
			oldest = c
		}
	}
	return oldest
}

// authenticated marks the connection from remote addr as authenticated.
// Every call that passed the tap check calls it.
func (g *authGate) authenticated(addr string) {
	g.mu.RLock()
	c := g.conns[addr]
	g.mu.RUnlock()
	if c != nil && !c.authed.Swap(true) {
		if t := c.timer.Load(); t != nil {
			t.Stop()
		}
	}
}

// drop closes c before it authenticated, for reason.
func (c *gatedConn) drop(reason string) {
	if c.authed.Load() {
		return
	}
	first := false
	c.once.Do(func() { first = true })
	if !first {
		return
	}
	c.g.closed(reason)
	c.release()
	_ = c.Conn.Close()
}

func (c *gatedConn) Close() error {
	c.once.Do(c.release)
	return c.Conn.Close()
}

// release gives c's place back; once per connection.
func (c *gatedConn) release() {
	if t := c.timer.Load(); t != nil {
		t.Stop()
	}
	g := c.g
	g.mu.Lock()
	if g.conns[c.key] == c {
		delete(g.conns, c.key)
	}
	g.open--
	if g.byHost[c.host]--; g.byHost[c.host] <= 0 {
		delete(g.byHost, c.host)
	}
	g.freed.Signal()
	g.mu.Unlock()
}

// hostOf is the host part of a connection's remote address.
func hostOf(a net.Addr) string {
	if ta, ok := a.(*net.TCPAddr); ok {
		return ta.IP.String()
	}
	host, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	return host
}

// tap runs on a call's headers, before its body is read. With check, it
// checks the call's token (or, on the Unix socket, its peer's uid) and
// marks a TCP connection authenticated (g nil: the Unix socket, which has
// no gate): the interceptors check again with the rest of the call's
// context (the tenant's methods); this check only keeps strangers from
// costing the daemon anything. It then hands the call what receive needs
// (receive.go). Without check (a Unix socket without tokens), every
// caller is the admin.
func (s *Server) tap(g *authGate, check bool) tap.ServerInHandle {
	listener := "tcp"
	if g == nil {
		listener = "unix"
	}
	return func(ctx context.Context, info *tap.Info) (context.Context, error) {
		if !check {
			return withReceiveCtl(ctx, "admin"), nil
		}
		tok, has := bearerOf(info.Header)
		p, err := s.tenancy.authenticate(tok, has, callerOf(ctx, g == nil))
		if err != nil {
			s.metrics.authRefusals.WithLabelValues(listener, "token").Inc()
			from := ""
			if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
				from = p.Addr.String()
			}
			if u := unixPeerOf(ctx); u.known {
				from = fmt.Sprintf("uid %d pid %d", u.uid, u.pid)
			}
			s.sideLogs.Warn(s.log, "auth-token-"+listener, "API call refused before its body was read: missing or invalid token", "listener", listener, "peer", from, "method", info.FullMethodName)
			st, _ := status.FromError(err)
			return nil, st.Err()
		}
		if p, ok := peer.FromContext(ctx); ok && p.Addr != nil && g != nil {
			g.authenticated(p.Addr.String())
		}
		return withReceiveCtl(ctx, holderOf(p)), nil
	}
}
