package zmtp

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"
)

// Socket types exchanged in the READY command.
const (
	Pub    = "PUB"
	Sub    = "SUB"
	XPub   = "XPUB"
	XSub   = "XSUB"
	Router = "ROUTER"
	Dealer = "DEALER"
	Req    = "REQ"
	Rep    = "REP"
)

// Errors callers may test for.
var (
	// ErrProtocol reports a peer that violates ZMTP.
	ErrProtocol = errors.New("zmtp: protocol error")
	// ErrIncompatible reports a peer whose socket type cannot talk to ours
	// (e.g. a PUB connecting to our PUB) or whose mechanism is not NULL.
	ErrIncompatible = errors.New("zmtp: incompatible peer")
	// ErrFrameTooLarge reports an inbound frame above the connection's limit.
	ErrFrameTooLarge = errors.New("zmtp: frame too large")
	// ErrClosed reports use of a closed socket.
	ErrClosed = errors.New("zmtp: socket closed")
)

// Frame flag bits (ZMTP 3 §"Framing").
const (
	flagMore    = 0x01
	flagLong    = 0x02
	flagCommand = 0x04
)

const greetingLen = 64

// DefaultMaxFrame bounds inbound frames on server sockets: their peers only
// send subscriptions and small requests.
const DefaultMaxFrame = 1 << 20

// maxFramesPerMessage bounds the frames of one inbound message.
const maxFramesPerMessage = 64

// Command is a ZMTP command frame other than READY.
type Command struct {
	Name string
	Data []byte
}

// compatible lists, per socket type, the peer types it accepts (ZMTP 3.0
// socket semantics).
var compatible = map[string][]string{
	Pub:    {Sub, XSub},
	XPub:   {Sub, XSub},
	Sub:    {Pub, XPub},
	XSub:   {Pub, XPub},
	Router: {Dealer, Req, Router},
	Dealer: {Router, Rep, Dealer},
	Req:    {Router, Rep},
	Rep:    {Dealer, Req},
}

// Conn is a ZMTP connection after the handshake. Reads and writes may run
// on two goroutines (one reader, one writer); neither side is safe for
// concurrent use by several goroutines.
type Conn struct {
	nc           net.Conn
	r            *bufio.Reader
	w            *bufio.Writer
	peerType     string
	peerIdentity []byte
	maxFrame     int64
	hdr          [9]byte
}

// Handshake runs the ZMTP 3 greeting and NULL handshake on nc as a socket
// of type self, bounded by ctx. identity, if not empty, is sent as the
// Identity property (used by ROUTER peers). maxFrame bounds inbound frames
// (0 = DefaultMaxFrame). On error nc is left open for the caller to close.
func Handshake(ctx context.Context, nc net.Conn, self string, identity []byte, maxFrame int64) (*Conn, error) {
	if maxFrame <= 0 {
		maxFrame = DefaultMaxFrame
	}
	c := &Conn{
		nc:       nc,
		r:        bufio.NewReaderSize(nc, 16<<10),
		w:        bufio.NewWriterSize(nc, 64<<10),
		maxFrame: maxFrame,
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = nc.SetDeadline(dl)
	}
	// Cancellation interrupts blocked I/O through a past deadline. The
	// mutex orders it against the reset below, so a late cancellation can
	// never leave an established connection with an expired deadline.
	var mu sync.Mutex
	finished := false
	stop := context.AfterFunc(ctx, func() {
		mu.Lock()
		defer mu.Unlock()
		if !finished {
			_ = nc.SetDeadline(time.Unix(1, 0))
		}
	})
	defer func() {
		stop()
		mu.Lock()
		finished = true
		_ = nc.SetDeadline(time.Time{})
		mu.Unlock()
	}()
	if err := c.handshake(self, identity); err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("zmtp: handshake with %s: %w", nc.RemoteAddr(), ctx.Err())
		}
		return nil, fmt.Errorf("zmtp: handshake with %s: %w", nc.RemoteAddr(), err)
	}
	return c, nil
}

func (c *Conn) handshake(self string, identity []byte) error {
	// The whole greeting at once: libzmq sends its signature first and
	// waits for ours, which this satisfies.
	var g [greetingLen]byte
	g[0] = 0xff
	g[9] = 0x7f
	g[10], g[11] = 3, 1
	copy(g[12:32], "NULL")
	if _, err := c.w.Write(g[:]); err != nil {
		return err
	}
	if err := c.w.Flush(); err != nil {
		return err
	}
	var pg [greetingLen]byte
	if _, err := io.ReadFull(c.r, pg[:]); err != nil {
		return fmt.Errorf("read greeting: %w", err)
	}
	if pg[0] != 0xff || pg[9]&0x01 == 0 {
		return fmt.Errorf("%w: bad greeting signature", ErrProtocol)
	}
	if pg[10] < 3 {
		return fmt.Errorf("%w: peer speaks ZMTP %d.%d, need 3.x", ErrIncompatible, pg[10], pg[11])
	}
	if mech := strings.TrimRight(string(pg[12:32]), "\x00"); mech != "NULL" {
		return fmt.Errorf("%w: security mechanism %q (only NULL)", ErrIncompatible, mech)
	}

	props := appendProperty(nil, "Socket-Type", []byte(self))
	if len(identity) > 0 {
		props = appendProperty(props, "Identity", identity)
	}
	if err := c.WriteCommand("READY", props); err != nil {
		return err
	}
	if err := c.Flush(); err != nil {
		return err
	}
	flags, body, err := c.readFrame()
	if err != nil {
		return fmt.Errorf("read READY: %w", err)
	}
	if flags&flagCommand == 0 {
		return fmt.Errorf("%w: expected READY, got a message frame", ErrProtocol)
	}
	cmd, err := parseCommand(body)
	if err != nil {
		return err
	}
	if cmd.Name == "ERROR" {
		return fmt.Errorf("%w: peer refused: %s", ErrIncompatible, errorReason(cmd.Data))
	}
	if cmd.Name != "READY" {
		return fmt.Errorf("%w: expected READY, got %s", ErrProtocol, cmd.Name)
	}
	peerProps, err := parseProperties(cmd.Data)
	if err != nil {
		return err
	}
	c.peerType = string(peerProps["socket-type"])
	c.peerIdentity = peerProps["identity"]
	ok := false
	for _, t := range compatible[self] {
		ok = ok || t == c.peerType
	}
	if !ok {
		// Tell the peer why before the caller closes (ZMTP 3.1 ERROR).
		reason := "invalid socket type"
		_ = c.WriteCommand("ERROR", append([]byte{byte(len(reason))}, reason...))
		_ = c.Flush()
		return fmt.Errorf("%w: %s peer for a %s socket", ErrIncompatible, c.peerType, self)
	}
	return nil
}

// PeerType returns the peer's Socket-Type.
func (c *Conn) PeerType() string { return c.peerType }

// PeerIdentity returns the peer's Identity property (nil when absent).
func (c *Conn) PeerIdentity() []byte { return c.peerIdentity }

// RemoteAddr returns the peer's network address.
func (c *Conn) RemoteAddr() net.Addr { return c.nc.RemoteAddr() }

// NetConn returns the underlying connection (for deadlines and closing).
func (c *Conn) NetConn() net.Conn { return c.nc }

// Close closes the underlying connection.
func (c *Conn) Close() error { return c.nc.Close() }

// Read returns the next message (frames) or command. Exactly one of msg
// and cmd.Name is set on success.
func (c *Conn) Read() (msg [][]byte, cmd Command, err error) {
	for {
		flags, body, err := c.readFrame()
		if err != nil {
			return nil, Command{}, err
		}
		if flags&flagCommand != 0 {
			if len(msg) > 0 {
				return nil, Command{}, fmt.Errorf("%w: command inside a multipart message", ErrProtocol)
			}
			cmd, err := parseCommand(body)
			return nil, cmd, err
		}
		if len(msg) == maxFramesPerMessage {
			return nil, Command{}, fmt.Errorf("%w: more than %d frames in a message", ErrProtocol, maxFramesPerMessage)
		}
		msg = append(msg, body)
		if flags&flagMore == 0 {
			return msg, Command{}, nil
		}
	}
}

func (c *Conn) readFrame() (flags byte, body []byte, err error) {
	flags, err = c.r.ReadByte()
	if err != nil {
		return 0, nil, err
	}
	if flags&^(flagMore|flagLong|flagCommand) != 0 {
		return 0, nil, fmt.Errorf("%w: reserved frame flags %#x", ErrProtocol, flags)
	}
	var size uint64
	if flags&flagLong != 0 {
		if _, err := io.ReadFull(c.r, c.hdr[:8]); err != nil {
			return 0, nil, err
		}
		size = binary.BigEndian.Uint64(c.hdr[:8])
	} else {
		b, err := c.r.ReadByte()
		if err != nil {
			return 0, nil, err
		}
		size = uint64(b)
	}
	if size > uint64(c.maxFrame) {
		return 0, nil, fmt.Errorf("%w: %d bytes (limit %d)", ErrFrameTooLarge, size, c.maxFrame)
	}
	body = make([]byte, size)
	if _, err := io.ReadFull(c.r, body); err != nil {
		return 0, nil, err
	}
	return flags, body, nil
}

func (c *Conn) writeFrameHeader(flags byte, size int) error {
	if size > 255 {
		c.hdr[0] = flags | flagLong
		binary.BigEndian.PutUint64(c.hdr[1:9], uint64(size))
		_, err := c.w.Write(c.hdr[:9])
		return err
	}
	c.hdr[0], c.hdr[1] = flags, byte(size)
	_, err := c.w.Write(c.hdr[:2])
	return err
}

// WriteMessage buffers a multipart message; Flush sends it.
func (c *Conn) WriteMessage(frames [][]byte) error {
	for i, f := range frames {
		var flags byte
		if i < len(frames)-1 {
			flags = flagMore
		}
		if err := c.writeFrameHeader(flags, len(f)); err != nil {
			return err
		}
		if _, err := c.w.Write(f); err != nil {
			return err
		}
	}
	return nil
}

// WriteCommand buffers a command frame; Flush sends it.
func (c *Conn) WriteCommand(name string, data []byte) error {
	if len(name) == 0 || len(name) > 255 {
		return fmt.Errorf("%w: command name %q", ErrProtocol, name)
	}
	if err := c.writeFrameHeader(flagCommand, 1+len(name)+len(data)); err != nil {
		return err
	}
	if err := c.w.WriteByte(byte(len(name))); err != nil {
		return err
	}
	if _, err := c.w.WriteString(name); err != nil {
		return err
	}
	_, err := c.w.Write(data)
	return err
}

// Flush writes buffered frames to the network.
func (c *Conn) Flush() error { return c.w.Flush() }

func parseCommand(body []byte) (Command, error) {
	if len(body) < 1 || int(body[0]) > len(body)-1 || body[0] == 0 {
		return Command{}, fmt.Errorf("%w: malformed command frame", ErrProtocol)
	}
	n := int(body[0])
	return Command{Name: string(body[1 : 1+n]), Data: body[1+n:]}, nil
}

func appendProperty(b []byte, name string, value []byte) []byte {
	b = append(b, byte(len(name)))
	b = append(b, name...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(value)))
	return append(b, value...)
}

// parseProperties decodes READY metadata; names are case-insensitive.
func parseProperties(b []byte) (map[string][]byte, error) {
	props := make(map[string][]byte)
	for len(b) > 0 {
		n := int(b[0])
		if n == 0 || len(b) < 1+n+4 {
			return nil, fmt.Errorf("%w: malformed READY property", ErrProtocol)
		}
		name := strings.ToLower(string(b[1 : 1+n]))
		b = b[1+n:]
		vlen := binary.BigEndian.Uint32(b[:4])
		b = b[4:]
		if uint64(vlen) > uint64(len(b)) {
			return nil, fmt.Errorf("%w: READY property %q overruns the frame", ErrProtocol, name)
		}
		props[name] = b[:vlen]
		b = b[vlen:]
	}
	return props, nil
}

func errorReason(data []byte) string {
	if len(data) > 0 && int(data[0]) <= len(data)-1 {
		return string(data[1 : 1+int(data[0])])
	}
	return "unknown reason"
}

// pong builds the PONG answer to a PING command's data (TTL then context).
func pong(ping []byte) []byte {
	if len(ping) < 2 {
		return nil
	}
	ctx := ping[2:]
	if len(ctx) > 16 {
		ctx = ctx[:16]
	}
	return ctx
}
