package zmtp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func ctx10(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func bindPub(t *testing.T, opts PubOptions) (*PubSocket, string) {
	t.Helper()
	p := NewPub(opts)
	addr, err := p.Bind("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	return p, "tcp://" + addr.String()
}

func subscriptions(p *PubSocket) int {
	n := 0
	for _, ps := range p.Stats().Peers {
		n += ps.Subscriptions
	}
	return n
}

// dialSub connects a SUB, subscribes to prefix and waits until the
// publisher has registered the subscription.
func dialSub(t *testing.T, p *PubSocket, endpoint, prefix string) *Conn {
	t.Helper()
	before := subscriptions(p)
	c, err := Dial(ctx10(t), endpoint, Sub, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if err := c.Subscribe([]byte(prefix)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "subscription", func() bool { return subscriptions(p) > before })
	return c
}

func recv(t *testing.T, c *Conn) [][]byte {
	t.Helper()
	_ = c.NetConn().SetReadDeadline(time.Now().Add(10 * time.Second))
	msg, err := c.Recv()
	if err != nil {
		t.Fatalf("recv: %v", err)
	}
	return msg
}

func msgN(topic string, n int, size int) [][]byte {
	payload := make([]byte, size)
	payload[0] = byte(n)
	return [][]byte{[]byte(topic), binary.BigEndian.AppendUint64(nil, uint64(n)), payload}
}

func TestPubSubTopicPrefix(t *testing.T) {
	p, ep := bindPub(t, PubOptions{})
	all := dialSub(t, p, ep, "")
	kv := dialSub(t, p, ep, "kv@")
	other := dialSub(t, p, ep, "other")

	p.Send(msgN("kv@host:1@m", 1, 300)) // > 255 bytes: long frame
	p.Send(msgN("x", 2, 3))
	for _, want := range []int{1, 2} {
		got := recv(t, all)
		if len(got) != 3 || binary.BigEndian.Uint64(got[1]) != uint64(want) {
			t.Fatalf("all: got %q, want message %d", got, want)
		}
	}
	if got := recv(t, kv); string(got[0]) != "kv@host:1@m" || len(got[2]) != 300 {
		t.Fatalf("kv: got topic %q len %d", got[0], len(got[2]))
	}
	// other must get nothing: a sentinel it does subscribe to arrives first.
	p.Send(msgN("other-sentinel", 3, 1))
	if got := recv(t, other); string(got[0]) != "other-sentinel" {
		t.Fatalf("other received %q", got[0])
	}
}

func TestSubscribeCommandAndCancel(t *testing.T) {
	p, ep := bindPub(t, PubOptions{})
	c, err := Dial(ctx10(t), ep, Sub, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.SubscribeCommand([]byte("a")); err != nil {
		t.Fatal(err)
	}
	if err := c.Subscribe([]byte("b")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "two subscriptions", func() bool { return subscriptions(p) == 2 })
	if err := c.Cancel([]byte("a")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "cancel", func() bool { return subscriptions(p) == 1 })
	p.Send(msgN("a1", 1, 1))
	p.Send(msgN("b1", 2, 1))
	if got := recv(t, c); string(got[0]) != "b1" {
		t.Fatalf("got %q after cancelling a", got[0])
	}
}

func TestIncompatiblePeerRejected(t *testing.T) {
	_, ep := bindPub(t, PubOptions{})
	if _, err := Dial(ctx10(t), ep, Pub, nil); !errors.Is(err, ErrIncompatible) {
		t.Fatalf("PUB dialling PUB: %v, want ErrIncompatible", err)
	}
}

func TestGarbagePeerDoesNotHurt(t *testing.T) {
	p, ep := bindPub(t, PubOptions{HandshakeTimeout: 200 * time.Millisecond})
	good := dialSub(t, p, ep, "")
	for _, junk := range [][]byte{
		[]byte("GET / HTTP/1.1\r\n\r\n" + string(make([]byte, 64))),
		nil, // silent peer: handshake timeout
	} {
		nc, err := net.Dial("tcp", ep[len("tcp://"):])
		if err != nil {
			t.Fatal(err)
		}
		_, _ = nc.Write(junk)
		defer nc.Close()
	}
	// A subscriber that sends an oversized frame is dropped.
	bad := dialSub(t, p, ep, "")
	big := make([]byte, 9)
	big[0] = flagLong
	binary.BigEndian.PutUint64(big[1:], 1<<40)
	_, _ = bad.NetConn().Write(big)
	waitFor(t, "oversized-frame peer dropped", func() bool { return len(p.Stats().Peers) == 1 })
	p.Send(msgN("t", 1, 1))
	if got := recv(t, good); string(got[0]) != "t" {
		t.Fatalf("good subscriber got %q", got[0])
	}
}

// A subscriber that never reads must not stop a healthy one from getting
// every message (the property go-zeromq/zmq4 lacks).
func TestStalledSubscriberDoesNotStarveHealthy(t *testing.T) {
	const n, size, hwm = 3000, 8 << 10, 500
	p, ep := bindPub(t, PubOptions{HWM: hwm})
	stalled := dialSub(t, p, ep, "")
	_ = stalled
	healthy := dialSub(t, p, ep, "")
	var got atomic.Int64
	errc := make(chan error, 1)
	go func() {
		for i := range n {
			_ = healthy.NetConn().SetReadDeadline(time.Now().Add(10 * time.Second))
			msg, err := healthy.Recv()
			if err != nil {
				errc <- err
				return
			}
			if seq := binary.BigEndian.Uint64(msg[1]); seq != uint64(i) {
				errc <- fmt.Errorf("healthy got seq %d, want %d", seq, i)
				return
			}
			got.Add(1)
		}
		errc <- nil
	}()
	for i := range n {
		// Stay within the healthy subscriber's HWM; the stalled one falls
		// behind without bound.
		for int64(i)-got.Load() >= hwm/2 {
			time.Sleep(time.Millisecond)
		}
		p.Send(msgN("t", i, size))
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	var stalledDrops uint64
	for _, ps := range p.Stats().Peers {
		stalledDrops = max(stalledDrops, ps.Dropped)
	}
	if stalledDrops == 0 {
		t.Errorf("stalled subscriber dropped nothing; the test did not exercise its HWM")
	}
	// Closing with a stalled peer ends at the deadline and says so.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := p.Close(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Close with a stalled subscriber: %v, want deadline exceeded", err)
	}
}

func TestHWMDropsOldest(t *testing.T) {
	p, ep := bindPub(t, PubOptions{HWM: 4})
	c := dialSub(t, p, ep, "")
	// Hold the subscriber's writer: fill its socket buffers first so that
	// the queue backs up, then check which messages survive.
	// 16 MiB is more than loopback socket buffers hold, so the writer
	// blocks on it while the small messages overflow the queue of 4.
	big := 16 << 20
	p.Send(msgN("t", 0, big))
	for i := 1; i <= 10; i++ {
		p.Send(msgN("t", i, 1))
	}
	var seqs []uint64
	for len(seqs) == 0 || seqs[len(seqs)-1] != 10 {
		seqs = append(seqs, uint64(recv(t, c)[2][0]))
	}
	dropped := p.Stats().Dropped
	if uint64(len(seqs))+dropped != 11 || dropped == 0 {
		t.Fatalf("received %v and dropped %d, want some dropped and 11 in all", seqs, dropped)
	}
	// Drop-oldest: the queue kept the four newest.
	if tail := seqs[len(seqs)-4:]; !slices.Equal(tail, []uint64{7, 8, 9, 10}) {
		t.Fatalf("received %v, want it to end with 7 8 9 10", seqs)
	}
}

func TestCloseDeliversQueued(t *testing.T) {
	for _, ep := range []string{"tcp://127.0.0.1:0", "ipc://" + filepath.Join(t.TempDir(), "pub.sock")} {
		t.Run(ep[:3], func(t *testing.T) {
			const n = 2000
			p := NewPub(PubOptions{HWM: n})
			addr, err := p.Bind(ep)
			if err != nil {
				t.Fatal(err)
			}
			dialEP := ep
			if addr.Network() == "tcp" {
				dialEP = "tcp://" + addr.String()
			}
			c := dialSub(t, p, dialEP, "")
			for i := range n {
				p.Send(msgN("t", i, 1024))
			}
			closed := make(chan error, 1)
			go func() { closed <- p.Close(ctx10(t)) }()
			for i := range n {
				if seq := binary.BigEndian.Uint64(recv(t, c)[1]); seq != uint64(i) {
					t.Fatalf("got %d, want %d", seq, i)
				}
			}
			// The publisher ends the stream after the last message.
			if _, err := c.Recv(); err == nil {
				t.Errorf("stream not closed after the queued messages")
			}
			c.Close()
			if err := <-closed; err != nil {
				t.Fatalf("Close: %v", err)
			}
		})
	}
}

func TestConnectRedials(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	p := NewPub(PubOptions{ReconnectInterval: 10 * time.Millisecond})
	defer p.Close(context.Background())
	if err := p.Connect("tcp://" + ln.Addr().String()); err != nil {
		t.Fatal(err)
	}
	for round := range 2 {
		nc, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		c, err := Handshake(ctx10(t), nc, Sub, nil, ClientMaxFrame)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Subscribe(nil); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "subscription", func() bool { return subscriptions(p) == 1 })
		p.Send(msgN("t", round, 1))
		if got := binary.BigEndian.Uint64(recv(t, c)[1]); got != uint64(round) {
			t.Fatalf("round %d got %d", round, got)
		}
		c.Close() // the publisher must redial
		waitFor(t, "peer gone", func() bool { return len(p.Stats().Peers) == 0 })
	}
}

func TestRouterDealer(t *testing.T) {
	var gotID []byte
	r := NewRouter(func(id []byte, msg [][]byte, reply func(...[]byte) error) {
		gotID = id
		for i := range 3 {
			if reply(append([][]byte{{}}, append(msg[1:], []byte{byte(i)})...)...) != nil {
				return
			}
		}
	}, RouterOptions{})
	defer r.Close()
	addr, err := r.Bind("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d, err := Dial(ctx10(t), "tcp://"+addr.String(), Dealer, []byte("me"))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := d.Send([]byte{}, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		got := recv(t, d)
		if len(got) != 3 || len(got[0]) != 0 || string(got[1]) != "hello" || got[2][0] != byte(i) {
			t.Fatalf("reply %d: %q", i, got)
		}
	}
	if string(gotID) != "me" {
		t.Errorf("routing id %q, want the Identity property", gotID)
	}
}

func TestParseEndpoint(t *testing.T) {
	for ep, want := range map[string]string{
		"tcp://*:5557":      "tcp :5557",
		"tcp://[::]:1":      "tcp [::]:1",
		"tcp://10.0.0.1:*":  "tcp 10.0.0.1:0",
		"ipc:///tmp/x.sock": "unix /tmp/x.sock",
	} {
		n, a, err := ParseEndpoint(ep)
		if err != nil || n+" "+a != want {
			t.Errorf("ParseEndpoint(%q) = %q %q %v, want %q", ep, n, a, err, want)
		}
	}
	for _, ep := range []string{"inproc://x", "tcp://nohost", "udp://1:2", "", "tcp://"} {
		if _, _, err := ParseEndpoint(ep); !errors.Is(err, ErrEndpoint) {
			t.Errorf("ParseEndpoint(%q) error %v, want ErrEndpoint", ep, err)
		}
	}
}

// FuzzRead feeds arbitrary bytes to the frame reader: it must return
// messages or an error, never panic or over-allocate.
func FuzzRead(f *testing.F) {
	f.Add([]byte{0x00, 0x01, 'a'})
	f.Add([]byte{0x04, 0x0a, 0x09, 'S', 'U', 'B', 'S', 'C', 'R', 'I', 'B', 'E'})
	f.Add([]byte{0x02, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{0x01, 0x00, 0x04, 0x05, 0x04, 'P', 'I', 'N', 'G'})
	f.Fuzz(func(t *testing.T, data []byte) {
		c := &Conn{r: bufio.NewReader(bytes.NewReader(data)), maxFrame: 1 << 16}
		for range 100 {
			if _, _, err := c.Read(); err != nil {
				return
			}
		}
	})
}

func TestParsePropertiesMalformed(t *testing.T) {
	for _, b := range [][]byte{{0}, {5, 'a'}, {1, 'a', 0, 0, 0, 9, 'x'}} {
		if _, err := parseProperties(b); !errors.Is(err, ErrProtocol) {
			t.Errorf("parseProperties(%v) = %v, want ErrProtocol", b, err)
		}
	}
	p, err := parseProperties(appendProperty(nil, "Socket-Type", []byte("SUB")))
	if err != nil || string(p["socket-type"]) != "SUB" {
		t.Errorf("round trip: %v %v", p, err)
	}
}

// TestRouterGivesUpOnAClientThatDoesNotRead: a replay client that asks for
// more than the socket buffers hold and never reads must not hold the
// handler (and what it replies with) forever.
func TestRouterGivesUpOnAClientThatDoesNotRead(t *testing.T) {
	big := make([]byte, 1<<20)
	returned := make(chan error, 1)
	r := NewRouter(func(_ []byte, _ [][]byte, reply func(...[]byte) error) {
		var err error
		for range 256 { // far more than a socket buffers
			if err = reply([]byte{}, big); err != nil {
				break
			}
		}
		returned <- err
	}, RouterOptions{WriteTimeout: 100 * time.Millisecond})
	defer r.Close()
	ep := "ipc://" + filepath.Join(t.TempDir(), "replay.sock")
	if _, err := r.Bind(ep); err != nil {
		t.Fatal(err)
	}
	d, err := Dial(ctx10(t), ep, Dealer, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := d.Send([]byte{}, []byte("replay")); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-returned:
		if err == nil {
			t.Fatal("every reply to a client that never reads succeeded")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("handler still blocked on a client that does not read")
	}
}

// TestRouterServesASlowClientThatKeepsReading: the write timeout is about
// progress, so a replay that takes longer than it in total still reaches
// a client that reads steadily.
func TestRouterServesASlowClientThatKeepsReading(t *testing.T) {
	// The write timeout bounds each write, not the whole answer: a client
	// that keeps reading, if slowly, gets all of it. The answer takes
	// twice the timeout in all, with a hundred times the timeout's margin
	// on each pause, so a busy machine stretching the pauses cannot make
	// one look like a stalled reader.
	const n = 200
	frame := make([]byte, 64<<10)
	r := NewRouter(func(_ []byte, _ [][]byte, reply func(...[]byte) error) {
		for range n {
			if reply([]byte{}, frame) != nil {
				return
			}
		}
	}, RouterOptions{WriteTimeout: time.Second})
	defer r.Close()
	ep := "ipc://" + filepath.Join(t.TempDir(), "replay.sock")
	if _, err := r.Bind(ep); err != nil {
		t.Fatal(err)
	}
	d, err := Dial(ctx10(t), ep, Dealer, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := d.Send([]byte{}, []byte("replay")); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for i := range n {
		time.Sleep(10 * time.Millisecond) // 200 × 10 ms: twice the timeout in all
		_ = d.NetConn().SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := d.Recv(); err != nil {
			t.Fatalf("reply %d of %d after %v: %v", i+1, n, time.Since(start), err)
		}
	}
}
