package zmtp

import (
	"bytes"
	"context"
	"net"
	"testing"
	"time"
)

// scriptConn is a net.Conn whose peer sends a fixed byte string and
// swallows whatever is written to it.
type scriptConn struct {
	r *bytes.Reader
}

func (c *scriptConn) Read(p []byte) (int, error)       { return c.r.Read(p) }
func (c *scriptConn) Write(p []byte) (int, error)      { return len(p), nil }
func (c *scriptConn) Close() error                     { return nil }
func (c *scriptConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *scriptConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (c *scriptConn) SetDeadline(time.Time) error      { return nil }
func (c *scriptConn) SetReadDeadline(time.Time) error  { return nil }
func (c *scriptConn) SetWriteDeadline(time.Time) error { return nil }

// peerGreeting is a ZMTP 3.1 NULL greeting followed by a READY command
// with props.
func peerGreeting(props []byte) []byte {
	var g [greetingLen]byte
	g[0], g[9], g[10], g[11] = 0xff, 0x7f, 3, 1
	copy(g[12:], "NULL")
	body := append([]byte{5}, "READY"...)
	body = append(body, props...)
	out := append(g[:], flagCommand|flagLong)
	out = append(out, 0, 0, 0, 0, 0, 0, 0, byte(len(body)))
	return append(out, body...)
}

// FuzzHandshake feeds arbitrary peer greetings and READY commands (the
// socket type, identity and other properties a subscriber or replay
// client announces) to the handshake of our PUB and ROUTER sockets: it
// must end in a connection or an error, never a panic.
func FuzzHandshake(f *testing.F) {
	f.Add(peerGreeting(appendProperty(nil, "Socket-Type", []byte(Sub))))
	f.Add(peerGreeting(appendProperty(appendProperty(nil, "Socket-Type", []byte(Dealer)), "Identity", []byte("me"))))
	f.Add(peerGreeting([]byte{11, 'S', 'o', 'c', 'k', 'e', 't', '-', 'T', 'y', 'p', 'e', 0xff, 0xff, 0xff, 0xff}))
	f.Add(peerGreeting(nil))
	f.Add([]byte{0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0x7f, 2})
	f.Fuzz(func(t *testing.T, peer []byte) {
		for _, self := range []string{Pub, Router} {
			c, err := Handshake(context.Background(), &scriptConn{r: bytes.NewReader(peer)}, self, nil, 1<<16)
			if err == nil && c.PeerType() == "" {
				t.Fatalf("%s handshake accepted a peer without a socket type", self)
			}
		}
	})
}
