package slotpipe

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
)

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// The value a server stores is the pieces joined, with the TTL asked for;
// a connection whose replies are all read goes back to its pool and is
// used again.
func TestSetStoresThePiecesJoined(t *testing.T) {
	m := miniredis.RunT(t)
	p := New(Options{Timeout: 5 * time.Second})
	defer p.Close()
	ctx := ctxT(t)
	c, err := p.Get(ctx, m.Addr())
	if err != nil {
		t.Fatal(err)
	}
	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<16)
	cases := []struct {
		key        string
		ttl        time.Duration
		head, body []byte
	}{
		{"a", 0, []byte("head:"), big},
		{"b", 90 * time.Second, nil, []byte("x")},
		{"c", 0, nil, nil},
		{"d", time.Microsecond, []byte("y"), nil}, // rounds up to 1 ms
	}
	for _, tc := range cases {
		if err := c.Set(ctx, tc.key, tc.ttl, tc.head, tc.body); err != nil {
			t.Fatal(err)
		}
	}
	errs, err := c.Replies(ctx)
	if err != nil || len(errs) != len(cases) {
		t.Fatalf("replies %v, %v", errs, err)
	}
	for i, tc := range cases[:3] {
		if errs[i] != nil {
			t.Errorf("%s: %v", tc.key, errs[i])
		}
		got, err := m.Get(tc.key)
		if want := string(tc.head) + string(tc.body); err != nil || got != want {
			t.Errorf("%s: stored %d bytes (%v), want %d", tc.key, len(got), err, len(want))
		}
		if ttl := m.TTL(tc.key); ttl != tc.ttl {
			t.Errorf("%s: ttl %v, want %v", tc.key, ttl, tc.ttl)
		}
	}
	if ttl := m.TTL("d"); ttl != time.Millisecond {
		t.Errorf("d: ttl %v, want 1ms", ttl)
	}
	c.Put()
	again, err := p.Get(ctx, m.Addr())
	if err != nil || again != c {
		t.Fatalf("the idle connection was not reused: %p %p %v", again, c, err)
	}
	again.Close()
}

// AUTH (with and without a user name) and SELECT run on dial; a refused
// login is an error and no connection.
func TestLogin(t *testing.T) {
	ctx := ctxT(t)
	m := miniredis.RunT(t)
	m.RequireUserAuth("u", "pw")
	for _, tc := range []struct {
		user, pw string
		ok       bool
	}{{"u", "pw", true}, {"u", "bad", false}, {"", "", false}} {
		p := New(Options{Username: tc.user, Password: tc.pw, DB: 3})
		c, err := p.Get(ctx, m.Addr())
		if (err == nil) != tc.ok {
			t.Fatalf("login %q/%q: %v", tc.user, tc.pw, err)
		}
		if err != nil {
			continue
		}
		if err := c.Set(ctx, "k", 0, nil, []byte("v")); err != nil {
			t.Fatal(err)
		}
		if errs, err := c.Replies(ctx); err != nil || errs[0] != nil {
			t.Fatal(errs, err)
		}
		if got, _ := m.DB(3).Get("k"); got != "v" {
			t.Errorf("SELECT 3: db 3 holds %q", got)
		}
		c.Close()
		p.Close()
	}
	m2 := miniredis.RunT(t)
	m2.RequireAuth("only")
	c, err := New(Options{Password: "only"}).Get(ctx, m2.Addr())
	if err != nil {
		t.Fatalf("AUTH <password>: %v", err)
	}
	c.Close()
}

// serveTCP listens on loopback and runs handle on each connection it
// accepts (i counts them from 0), closing it when handle returns.
func serveTCP(t *testing.T, handle func(i int, nc net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for i := 0; ; i++ {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer nc.Close()
				handle(i, nc)
			}()
		}
	}()
	return ln.Addr().String()
}

// fakeServer answers every command it reads with the next of replies
// (raw bytes) and then hangs up.
func fakeServer(t *testing.T, replies ...string) string {
	return serveTCP(t, func(_ int, nc net.Conn) {
		r := bufio.NewReader(nc)
		for _, rep := range replies {
			if skipCommand(r) != nil {
				return
			}
			if _, err := io.WriteString(nc, rep); err != nil {
				return
			}
		}
	})
}

// skipCommand reads one RESP array of bulk strings.
func skipCommand(r *bufio.Reader) error {
	var n int
	if _, err := fmtSscanLine(r, "*%d", &n); err != nil {
		return err
	}
	for range n {
		var l int
		if _, err := fmtSscanLine(r, "$%d", &l); err != nil {
			return err
		}
		if _, err := r.Discard(l + 2); err != nil {
			return err
		}
	}
	return nil
}

// Each command gets its own verdict: OK, or the server's error (MOVED is
// an error here: redirections are the caller's); a reply that is not a
// SET's is a protocol error and the connection does not go back.
func TestReplies(t *testing.T) {
	ctx := ctxT(t)
	for _, tc := range []struct {
		name    string
		replies []string
		verdict []string // "" for OK
		proto   bool
	}{
		{"ok", []string{"+OK\r\n", "+OK\r\n"}, []string{"", ""}, false},
		{"errors", []string{"-MOVED 3999 127.0.0.1:6381\r\n", "+OK\r\n", "-OOM command not allowed\r\n"},
			[]string{"MOVED 3999 127.0.0.1:6381", "", "OOM command not allowed"}, false},
		{"integer", []string{"+OK\r\n", ":1\r\n"}, []string{""}, true},
		{"nil bulk", []string{"$-1\r\n"}, nil, true},
		{"other status", []string{"+QUEUED\r\n"}, nil, true},
		{"bare newline", []string{"+OK\n"}, nil, true},
		{"empty error", []string{"-\r\n"}, nil, true},
		{"too long", []string{"-" + strings.Repeat("x", MaxReplyLine) + "\r\n"}, nil, true},
		{"hang up", []string{"+OK\r\n"}, []string{""}, true}, // two sent, one answered
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := New(Options{})
			defer p.Close()
			c, err := p.Get(ctx, fakeServer(t, tc.replies...))
			if err != nil {
				t.Fatal(err)
			}
			n := len(tc.replies)
			if tc.name == "hang up" {
				n++
			}
			for range n {
				if err := c.Set(ctx, "k", 0, nil, []byte("v")); err != nil {
					t.Fatal(err)
				}
			}
			errs, err := c.Replies(ctx)
			if tc.proto != (err != nil) {
				t.Fatalf("err %v", err)
			}
			if tc.proto && tc.name != "hang up" && !errors.Is(err, ErrProtocol) {
				t.Errorf("err %v, want ErrProtocol", err)
			}
			if len(errs) != len(tc.verdict) {
				t.Fatalf("verdicts %q, want %q", errs, tc.verdict)
			}
			for i, v := range errs {
				var got string
				if v != nil {
					var re Error
					if !errors.As(v, &re) {
						t.Fatalf("verdict %d: %T", i, v)
					}
					got = v.Error()
				}
				if got != tc.verdict[i] {
					t.Errorf("verdict %d: %q, want %q", i, got, tc.verdict[i])
				}
			}
			c.Put() // broken or not, it must not be reused
			if tc.proto {
				if c.Set(ctx, "k", 0, nil, []byte("v")) == nil {
					t.Error("a connection that saw an error accepted another command")
				}
			}
		})
	}
}

// A write to a server that does not read returns at once from Set (the
// rest goes on in the background) and ends with the timeout or with the
// context at the next Ready or Replies; it never hangs.
func TestWritesAreBounded(t *testing.T) {
	accepted := make(chan struct{}, 2)
	release := make(chan struct{})
	defer close(release)
	addr := serveTCP(t, func(int, net.Conn) {
		accepted <- struct{}{}
		<-release // never read
	})
	big := make([]byte, 64<<20) // more than any socket buffer
	ctx := ctxT(t)

	p := New(Options{Timeout: 50 * time.Millisecond})
	c, err := p.Get(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Set(ctx, "k", 0, nil, big); err != nil {
		t.Fatalf("set: %v", err)
	}
	if _, err := c.Replies(ctx); err == nil || !errors.Is(err, context.DeadlineExceeded) && !isTimeout(err) {
		t.Fatalf("write to a stalled server: %v", err)
	}
	c.Close()

	p = New(Options{})
	c, err = p.Get(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	if err := c.Set(cctx, "k", 0, nil, big); err != nil {
		t.Fatalf("set: %v", err)
	}
	go func() {
		<-accepted
		<-accepted // the second connection is up: its write is under way
		cancel()
	}()
	if err := c.Ready(cctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("write canceled: %v", err)
	}
	c.Close()
}

// Set does not read head or body once it returns, however slow the
// server: bytes changed after it are not the bytes the server gets.
func TestSetReadsThePiecesOnlyUntilItReturns(t *testing.T) {
	const size = 16 << 20 // more than the socket takes at once
	orig := func(i int) byte { return byte(i*7 + i>>11) }
	body := make([]byte, size)
	for i := range body {
		body[i] = orig(i)
	}
	head := []byte("HEAD")
	start := make(chan struct{})
	got := make(chan error, 1)
	addr := serveTCP(t, func(_ int, nc net.Conn) {
		<-start // read nothing until the client has changed its buffers
		r := bufio.NewReader(nc)
		var n, l int
		if _, err := fmtSscanLine(r, "*%d", &n); err != nil {
			got <- err
			return
		}
		for range 2 { // SET, the key
			fmtSscanLine(r, "$%d", &l)
			r.Discard(l + 2)
		}
		fmtSscanLine(r, "$%d", &l)
		v := make([]byte, l+2)
		if _, err := io.ReadFull(r, v); err != nil {
			got <- err
			return
		}
		err := error(nil)
		if string(v[:4]) != "HEAD" {
			err = errors.New("the head changed on the wire")
		}
		for i, b := range v[4 : 4+size] {
			if b != orig(i) {
				err = errors.New("the body changed on the wire")
				break
			}
		}
		io.WriteString(nc, "+OK\r\n")
		got <- err
	})
	ctx := ctxT(t)
	c, err := New(Options{}).Get(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Set(ctx, "k", 0, head, body); err != nil {
		t.Fatal(err)
	}
	clear(body)
	copy(head, "XXXX")
	close(start)
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if v, err := c.Replies(ctx); err != nil || v[0] != nil {
		t.Fatal(v, err)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// Closed pools dial nothing and keep nothing.
func TestClosedPools(t *testing.T) {
	m := miniredis.RunT(t)
	ctx := ctxT(t)
	p := New(Options{})
	c, err := p.Get(ctx, m.Addr())
	if err != nil {
		t.Fatal(err)
	}
	p.Close()
	if _, err := p.Get(ctx, m.Addr()); !errors.Is(err, ErrClosed) {
		t.Fatalf("get after close: %v", err)
	}
	c.Put()
	if c.Set(ctx, "k", 0, nil, []byte("v")) == nil {
		if _, err := c.Replies(ctx); err == nil {
			t.Fatal("a connection put back into closed pools still works")
		}
	}
}

// FuzzReplies: whatever a server sends, reading the replies of n
// commands never panics, returns at most n verdicts, and OK only for
// exactly "+OK\r\n".
func FuzzReplies(f *testing.F) {
	for _, s := range []string{"+OK\r\n+OK\r\n", "-MOVED 1 a:1\r\n+OK\r\n", ":1\r\n", "$-1\r\n", "+OK\n", "-\r\n", "+OK\r"} {
		f.Add([]byte(s), uint8(2))
	}
	f.Fuzz(func(t *testing.T, data []byte, n uint8) {
		c := &Conn{r: bufio.NewReaderSize(bytes.NewReader(data), MaxReplyLine), sets: int(n)}
		errs, err := c.readStatus()
		if len(errs) > int(n) || (err == nil && len(errs) != int(n)) {
			t.Fatalf("%d verdicts for %d commands (err %v)", len(errs), n, err)
		}
		rest := data
		for i, v := range errs {
			line, after, _ := bytes.Cut(rest, []byte("\n"))
			rest = after
			if (v == nil) != (string(line) == "+OK\r") {
				t.Fatalf("verdict %d %v for line %q", i, v, line)
			}
		}
	})
}

// fmtSscanLine reads one CRLF line from r and scans it with format.
func fmtSscanLine(r *bufio.Reader, format string, a ...any) (int, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return 0, err
	}
	return fmt.Sscanf(strings.TrimRight(line, "\r\n"), format, a...)
}

// The writes of a pipeline do not wait for replies: a server that reads
// every command before it answers any gets them all.
func TestSetsArePipelined(t *testing.T) {
	const n = 16
	addr := serveTCP(t, func(_ int, nc net.Conn) {
		r := bufio.NewReader(nc)
		for range n {
			if skipCommand(r) != nil {
				return
			}
		}
		io.WriteString(nc, strings.Repeat("+OK\r\n", n))
	})
	ctx := ctxT(t)
	c, err := New(Options{}).Get(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	block := make([]byte, 1<<20)
	for range n {
		if err := c.Set(ctx, "k", 0, []byte("h"), block); err != nil {
			t.Fatal(err)
		}
	}
	if errs, err := c.Replies(ctx); err != nil || len(errs) != n {
		t.Fatalf("%d replies, %v", len(errs), err)
	}
}

// An idle connection the server has closed is not handed out again: Get
// dials a new one.
func TestClosedIdleConnectionIsDropped(t *testing.T) {
	hungUp := make(chan struct{})
	accepted := make(chan struct{}, 2)
	addr := serveTCP(t, func(i int, nc net.Conn) {
		accepted <- struct{}{}
		if skipCommand(bufio.NewReader(nc)) == nil {
			io.WriteString(nc, "+OK\r\n")
		}
		if i == 0 {
			nc.Close()
			close(hungUp)
			return
		}
		io.Copy(io.Discard, nc)
	})
	ctx := ctxT(t)
	p := New(Options{})
	defer p.Close()
	c, err := p.Get(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Set(ctx, "k", 0, nil, []byte("v")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Replies(ctx); err != nil {
		t.Fatal(err)
	}
	c.Put()
	<-hungUp
	for deadline := time.Now().Add(10 * time.Second); alive(c.nc) && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond) // the FIN is on its way
	}
	c2, err := p.Get(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if c2 == c {
		t.Fatal("the closed connection was handed out again")
	}
	<-accepted
	<-accepted // the second dial reached the server
}

// A pipeline of GETs reads each value into the pieces when its length is
// theirs, into a buffer of its own when it is not (up to the bound), and
// tells a missing key from an empty value; the connection is reusable
// after.
func TestGetReadsIntoThePieces(t *testing.T) {
	m := miniredis.RunT(t)
	ctx := ctxT(t)
	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<16)
	m.Set("exact", "HEAD"+string(big))
	m.Set("short", "tiny")
	m.Set("long", string(big)+string(big))
	m.Set("empty", "")
	p := New(Options{Timeout: 5 * time.Second})
	defer p.Close()
	c, err := p.Get(ctx, m.Addr())
	if err != nil {
		t.Fatal(err)
	}
	keys := []string{"exact", "short", "missing", "long", "empty"}
	for _, k := range keys {
		c.Get(k)
	}
	head, body := make([]byte, 4), make([]byte, len(big))
	want := []Value{
		{Found: true, N: 4 + len(big), Into: true},
		{Found: true, N: 4, Other: []byte("tiny")},
		{},
		{Found: true, N: 2 * len(big)}, // over the bound: dropped
		{Found: true, N: 0, Other: []byte{}},
	}
	for i, k := range keys {
		v, err := c.ReadValue(ctx, len(big), head, body)
		if err != nil {
			t.Fatalf("%s: %v", k, err)
		}
		if v.Found != want[i].Found || v.N != want[i].N || v.Into != want[i].Into || !bytes.Equal(v.Other, want[i].Other) || (v.Other == nil) != (want[i].Other == nil) || v.Err != nil {
			t.Errorf("%s: %+v, want %+v", k, v, want[i])
		}
		if k == "exact" && (string(head) != "HEAD" || !bytes.Equal(body, big)) {
			t.Errorf("exact: other bytes in the pieces")
		}
	}
	if err := c.Set(ctx, "after", 0, nil, []byte("x")); err != nil {
		t.Fatal(err)
	}
	if v, err := c.Replies(ctx); err != nil || v[0] != nil {
		t.Fatal(v, err)
	}
	c.Put()
	if again, _ := p.Get(ctx, m.Addr()); again != c {
		t.Fatal("a connection whose replies were all read was not reused")
	}
}

// Replies to GET: the server's errors are verdicts, anything but a bulk
// string, nil or an error is a protocol error, a value cut short is a
// transport error; none of them is a value.
func TestValueReplies(t *testing.T) {
	ctx := ctxT(t)
	for _, tc := range []struct {
		name, reply string
		verdict     string // the server's error
		proto       bool   // ErrProtocol
		fails       bool   // any error
	}{
		{name: "moved", reply: "-MOVED 12 127.0.0.1:7002\r\n", verdict: "MOVED 12 127.0.0.1:7002"},
		{name: "value", reply: "$3\r\nabc\r\n"},
		{name: "nil", reply: "$-1\r\n"},
		{name: "status", reply: "+OK\r\n", proto: true, fails: true},
		{name: "integer", reply: ":3\r\n", proto: true, fails: true},
		{name: "array", reply: "*1\r\n$1\r\na\r\n", proto: true, fails: true},
		{name: "negative", reply: "$-2\r\n", proto: true, fails: true},
		{name: "signed", reply: "$+3\r\nabc\r\n", proto: true, fails: true},
		{name: "leading zero", reply: "$03\r\nabc\r\n", proto: true, fails: true},
		{name: "no crlf after", reply: "$3\r\nabcXY", proto: true, fails: true},
		{name: "cut short", reply: "$5\r\nab", fails: true},
		{name: "overflow", reply: "$99999999999999999999999\r\n", proto: true, fails: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := New(Options{}).Get(ctx, fakeServer(t, tc.reply))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.Get("k")
			v, err := c.ReadValue(ctx, 16, make([]byte, 3))
			if (err != nil) != tc.fails || tc.proto && !errors.Is(err, ErrProtocol) {
				t.Fatalf("err %v", err)
			}
			if tc.fails {
				if _, err := c.ReadValue(ctx, 16); err == nil {
					t.Error("a connection that saw an error read another value")
				}
				return
			}
			var got string
			if v.Err != nil {
				got = v.Err.Error()
			}
			if got != tc.verdict {
				t.Errorf("verdict %q, want %q", got, tc.verdict)
			}
		})
	}
}

// FuzzValue: whatever a server answers to GET, reading it never panics,
// and a value it reports is the bytes the reply carried.
func FuzzValue(f *testing.F) {
	for _, s := range []string{"$3\r\nabc\r\n", "$-1\r\n", "-MOVED 1 a:1\r\n", "$5\r\nabcde\r\n", "$1\r\nx\r\n", "$0\r\n\r\n", "$3\r\nabcXY"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c := &Conn{r: bufio.NewReaderSize(bytes.NewReader(data), MaxReplyLine), gets: 1}
		piece := make([]byte, 3)
		v, err := c.readValue(4, [][]byte{piece})
		if err != nil {
			return
		}
		line, rest, _ := bytes.Cut(data, []byte("\n"))
		switch {
		case v.Err != nil:
			if line[0] != '-' {
				t.Fatalf("error verdict from %q", line)
			}
		case !v.Found:
			if string(line) != "$-1\r" {
				t.Fatalf("missing from %q", line)
			}
		case v.Into:
			if v.N != 3 || !bytes.Equal(piece, rest[:3]) {
				t.Fatalf("value %q from %q", piece, data)
			}
		case v.Other != nil:
			if v.N > 4 || !bytes.Equal(v.Other, rest[:v.N]) {
				t.Fatalf("value %q from %q", v.Other, data)
			}
		default:
			if v.N <= 4 {
				t.Fatalf("a %d-byte value dropped under the bound", v.N)
			}
		}
	})
}
