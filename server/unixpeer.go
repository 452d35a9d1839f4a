package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// Callers on the Unix socket. The socket is 0600, so only the daemon's
// user (and root) can connect — but in a container or a node shared by
// several customers' engines that user is often everyone's. With tokens
// configured (an admin token or tenants), a call on the Unix socket
// therefore authenticates like one on TCP: by its bearer token, or, for a
// token-less call, by the connecting process's user id as the kernel
// reports it (SO_PEERCRED), looked up in Config.UnixPeers. A uid the
// operator has not named gets UNAUTHENTICATED. Without tokens the socket's
// permissions are the only guard and every caller there is the admin.

// unixPeer is the AuthInfo of a Unix-socket connection: the connecting
// process's credentials at connect time.
type unixPeer struct {
	uid, pid int
	known    bool // SO_PEERCRED answered
}

func (unixPeer) AuthType() string { return "unix-peercred" }

// unixPeerOf returns the Unix-socket credentials of a call's connection.
func unixPeerOf(ctx context.Context) unixPeer {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return unixPeer{}
	}
	u, _ := p.AuthInfo.(unixPeer)
	return u
}

// credConn is an accepted Unix connection with its peer's credentials.
type credConn struct {
	net.Conn
	cred    unixPeer
	release func()
	once    sync.Once
}

func (c *credConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// credListener accepts Unix connections, at most limit at a time (as
// netutil.LimitListener, which would hide the connection's type from the
// credentials below), and reads each one's peer credentials.
type credListener struct {
	*net.UnixListener
	sem       chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

func newCredListener(ln *net.UnixListener, limit int) *credListener {
	return &credListener{UnixListener: ln, sem: make(chan struct{}, limit), done: make(chan struct{})}
}

func (l *credListener) Close() error {
	err := l.UnixListener.Close()
	l.closeOnce.Do(func() { close(l.done) })
	return err
}

func (l *credListener) Accept() (net.Conn, error) {
	select {
	case l.sem <- struct{}{}:
	case <-l.done:
		return nil, net.ErrClosed
	}
	c, err := l.AcceptUnix()
	if err != nil {
		<-l.sem
		return nil, err
	}
	return &credConn{Conn: c, cred: peerCred(c), release: func() { <-l.sem }}, nil
}

// peerCred returns the credentials of c's peer (known false when the
// kernel does not say).
func peerCred(c *net.UnixConn) unixPeer {
	rc, err := c.SyscallConn()
	if err != nil {
		return unixPeer{}
	}
	var u *unix.Ucred
	var uerr error
	if err := rc.Control(func(fd uintptr) {
		u, uerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil || uerr != nil {
		return unixPeer{}
	}
	return unixPeer{uid: int(u.Uid), pid: int(u.Pid), known: true}
}

// peerCredentials hands a credConn's credentials to gRPC as the
// connection's AuthInfo (the transport stays plain: the socket is local).
type peerCredentials struct{}

func (peerCredentials) ServerHandshake(c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	if cc, ok := c.(*credConn); ok {
		return c, cc.cred, nil
	}
	return c, unixPeer{}, nil
}

func (peerCredentials) ClientHandshake(context.Context, string, net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("kvtier: Unix peer credentials are server-side only")
}

func (peerCredentials) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "unix-peercred"}
}

func (p peerCredentials) Clone() credentials.TransportCredentials { return p }

func (peerCredentials) OverrideServerName(string) error { return nil }

// setUnixPeers resolves the configured uid → principal names ("admin" or a
// tenant's name).
func (tn *tenancy) setUnixPeers(m map[int]string) error {
	tn.unixPeers = make(map[int]principal, len(m))
	for uid, name := range m {
		if uid < 0 {
			return fmt.Errorf("unix peer uid %d: must not be negative", uid)
		}
		if name == "admin" {
			tn.unixPeers[uid] = principal{}
			continue
		}
		t := tn.byName(name)
		if t == nil {
			return fmt.Errorf("unix peer uid %d: %q is neither \"admin\" nor a tenant", uid, name)
		}
		tn.unixPeers[uid] = principal{t: t}
	}
	return nil
}
