package slotpipe

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"syscall"
	"time"
)

// Conn is one connection to one server.
type Conn struct {
	pools  *Pools
	addr   string
	nc     net.Conn
	r      *bufio.Reader
	sets   int    // SETs (or login commands) written whose replies are unread
	gets   int    // GETs queued or written whose replies are unread
	out    []byte // GET commands queued, not yet written
	broken bool   // a transport or protocol error was seen
	// raw writes without blocking (nil over TLS: Set then copies the
	// whole value and writes it in the background).
	raw        syscall.RawConn
	background chan error // the background write of the last Set, if any
	prefix     []byte
	suffix     []byte
}

// Addr returns the server address of c.
func (c *Conn) Addr() string { return c.addr }

// Set writes SET key <head ++ body> [PX ttl] (ttl 0: no expiry) and
// returns without waiting on the server. What the socket takes at once
// goes straight from head and body in one vectored write; the rest is
// copied into the connection's own buffer and written in the background.
// Either way head and body are not read once Set returns, and the time
// they are read is bounded by memory speed, not by the server's: a caller
// that lends a buffer for the call (kvtier's slots) gets it back at once.
// Set waits only for the background write of the previous Set; call Ready
// before lending body to have that wait behind you. On error the
// connection is unusable: Close it. SETs and GETs do not mix on one
// connection between two reads of their replies.
func (c *Conn) Set(ctx context.Context, key string, ttl time.Duration, head, body []byte) error {
	if err := c.Ready(ctx); err != nil {
		return err
	}
	if c.broken || c.gets != 0 {
		return errors.New("slotpipe: set on a broken connection or one with GETs outstanding")
	}
	args := 3
	if ttl > 0 {
		args = 5
	}
	b := append(c.prefix[:0], '*')
	b = strconv.AppendInt(b, int64(args), 10)
	b = append(b, "\r\n$3\r\nSET\r\n"...)
	b = appendBulk(b, key)
	b = append(b, '$')
	b = strconv.AppendInt(b, int64(len(head)+len(body)), 10)
	b = append(b, "\r\n"...)
	c.prefix = b
	s := append(c.suffix[:0], "\r\n"...)
	if ttl > 0 {
		s = appendBulk(appendBulk(s, "PX"), strconv.FormatInt(max(ttl.Milliseconds(), 1), 10))
	}
	c.suffix = s
	vec := [4][]byte{c.prefix, head, body, c.suffix}
	n := 0
	if c.raw != nil {
		err := c.bounded(ctx, func() error {
			var err error
			n, err = writeNow(c.raw, vec[:])
			return err
		})
		if err != nil {
			c.broken = true
			return fmt.Errorf("set %s on %s: %w", key, c.addr, err)
		}
	}
	c.sets++
	total := -n
	for _, p := range vec {
		total += len(p)
	}
	if total == 0 {
		return nil
	}
	// Copy what the socket did not take, and write it in the background.
	spill := c.pools.spill(total)
	rest := (*spill)[:0]
	for _, p := range vec {
		skip := min(n, len(p))
		n -= skip
		rest = append(rest, p[skip:]...)
	}
	done := make(chan error, 1)
	c.background = done
	go func() {
		done <- c.bounded(ctx, func() error {
			_, err := c.nc.Write(rest)
			return err
		})
		c.pools.spills.Put(spill)
	}()
	return nil
}

// Ready waits until every byte of the previous Set is written, so that
// the next Set returns at memory speed. An error is the previous Set's
// (the connection is then unusable) or the context's.
func (c *Conn) Ready(ctx context.Context) error {
	if c.background == nil {
		return nil
	}
	select {
	case err := <-c.background:
		c.background = nil
		if err != nil {
			c.broken = true
			return fmt.Errorf("set on %s: %w", c.addr, err)
		}
		return nil
	case <-ctx.Done():
		c.broken = true // the write goes on until Close
		return ctx.Err()
	}
}

// Replies reads the replies of every Set since the last call, in order:
// nil for OK, an Error for a server error reply. A non-nil error is a
// transport or protocol failure after which the verdicts of the unread
// commands are unknown; the connection is then unusable.
func (c *Conn) Replies(ctx context.Context) ([]error, error) {
	if err := c.Ready(ctx); err != nil {
		return nil, err
	}
	var verdicts []error
	err := c.bounded(ctx, func() error {
		var err error
		verdicts, err = c.readStatus()
		return err
	})
	if err != nil {
		c.broken = true
		return verdicts, fmt.Errorf("replies from %s: %w", c.addr, err)
	}
	return verdicts, nil
}

// Get queues GET key; the next Value sends every queued GET at once.
func (c *Conn) Get(key string) {
	c.out = appendCommand(c.out, "GET", key)
	c.gets++
}

// Value is the reply to one GET.
type Value struct {
	Found bool  // false: the server holds no such key
	Err   error // the server's error reply (an Error), or nil
	N     int   // the value's length in bytes
	// Into: the value was exactly as long as the pieces given to
	// ReadValue and is in them.
	Into bool
	// Other holds a value of another length, up to the bound given to
	// ReadValue; nil beyond it (the bytes were read and dropped).
	Other []byte
}

// ReadValue reads the reply to the oldest unanswered GET, sending the
// queued GETs first. A value of exactly the pieces' total length is read
// into them in order; another of at most maxOther bytes into a buffer of
// its own. A non-nil error is a transport or protocol failure (the
// connection is then unusable and the pieces may hold part of a value).
func (c *Conn) ReadValue(ctx context.Context, maxOther int, pieces ...[]byte) (Value, error) {
	if c.broken || c.gets == 0 || c.sets != 0 {
		return Value{}, errors.New("slotpipe: read of a GET that was not queued, or on a broken connection")
	}
	var v Value
	err := c.bounded(ctx, func() error {
		if len(c.out) > 0 {
			if _, err := c.nc.Write(c.out); err != nil {
				return err
			}
			c.out = c.out[:0]
		}
		var err error
		v, err = c.readValue(maxOther, pieces)
		return err
	})
	if err != nil {
		c.broken = true
		return v, fmt.Errorf("value from %s: %w", c.addr, err)
	}
	c.gets--
	return v, nil
}

// Put returns c to its pool, or closes it if it is broken or has replies
// outstanding.
func (c *Conn) Put() {
	if c.broken || c.sets != 0 || c.gets != 0 || c.background != nil {
		c.nc.Close()
		return
	}
	c.pools.put(c)
}

// Close closes c.
func (c *Conn) Close() error { return c.nc.Close() }

// readStatus reads the status replies of c.sets commands.
func (c *Conn) readStatus() ([]error, error) {
	verdicts := make([]error, 0, c.sets)
	for c.sets > 0 {
		line, err := c.line()
		if err != nil {
			return verdicts, err
		}
		verdict, err := parseStatus(line)
		if err != nil {
			return verdicts, err
		}
		verdicts = append(verdicts, verdict)
		c.sets--
	}
	return verdicts, nil
}

// readValue reads one reply to GET.
func (c *Conn) readValue(maxOther int, pieces [][]byte) (Value, error) {
	line, err := c.line()
	if err != nil {
		return Value{}, err
	}
	n, verdict, err := parseBulkHeader(line)
	switch {
	case err != nil:
		return Value{}, err
	case verdict != nil:
		return Value{Found: true, Err: verdict}, nil
	case n < 0:
		return Value{}, nil
	}
	v := Value{Found: true, N: n}
	want := 0
	for _, p := range pieces {
		want += len(p)
	}
	switch {
	case n == want:
		v.Into = true
		for _, p := range pieces {
			if _, err := io.ReadFull(c.r, p); err != nil {
				return v, unexpectedEOF(err)
			}
		}
	case n <= maxOther:
		v.Other = make([]byte, n)
		if _, err := io.ReadFull(c.r, v.Other); err != nil {
			return v, unexpectedEOF(err)
		}
	default:
		if _, err := c.r.Discard(n); err != nil {
			return v, unexpectedEOF(err)
		}
	}
	var crlf [2]byte
	if _, err := io.ReadFull(c.r, crlf[:]); err != nil {
		return v, unexpectedEOF(err)
	}
	if crlf != [2]byte{'\r', '\n'} {
		return v, fmt.Errorf("%w: bulk string of %d bytes not followed by CRLF", ErrProtocol, n)
	}
	return v, nil
}

func unexpectedEOF(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// line reads one reply line, terminator included.
func (c *Conn) line() ([]byte, error) {
	line, err := c.r.ReadSlice('\n')
	if errors.Is(err, bufio.ErrBufferFull) {
		return nil, fmt.Errorf("%w: reply line over %d bytes", ErrProtocol, MaxReplyLine)
	}
	return line, err
}

// bounded runs op with c's deadline: the sooner of ctx's and the timeout;
// a context canceled meanwhile interrupts op.
func (c *Conn) bounded(ctx context.Context, op func() error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	deadline, ok := ctx.Deadline()
	if t := c.pools.opts.Timeout; t > 0 {
		if d := time.Now().Add(t); !ok || d.Before(deadline) {
			deadline, ok = d, true
		}
	}
	if !ok {
		deadline = time.Time{}
	}
	if err := c.nc.SetDeadline(deadline); err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() { c.nc.SetDeadline(time.Unix(1, 0)) })
	err := op()
	if !stop() && ctx.Err() != nil {
		// The deadline is in the past now: whatever op did, the
		// connection is done.
		if err == nil {
			return ctx.Err()
		}
		return fmt.Errorf("%w (%w)", ctx.Err(), err)
	}
	return err
}
