package server_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/status"

	kvtierv1 "github.com/kvtier/kvtier/api/kvtier/v1"
	"github.com/kvtier/kvtier/blockstream"
	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/server"
	rt "github.com/kvtier/kvtier/tiers/remote/remotetest"
)

func streamHello(t *testing.T, addr, token, ns string) (net.Conn, *bufio.Reader, byte) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	msg := []byte("KVBS\x01")
	for _, f := range []string{token, ns} {
		msg = binary.BigEndian.AppendUint16(msg, uint16(len(f)))
		msg = append(msg, f...)
	}
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	var reply [5]byte
	if _, err := io.ReadFull(r, reply[:]); err != nil {
		return c, r, 255
	}
	return c, r, reply[4]
}

// The block stream checks the token and the namespace, answers misses
// and hits with their checksum, refuses oversized requests, and does not
// hold Shutdown up with an idle connection.
func TestBlockStreamProtocol(t *testing.T) {
	e := startEnv(t, envOptions{slots: 8, tiers: noTiers, token: "tok", stream: true})
	addr := e.srv.StreamAddr()
	if addr == "" {
		t.Fatal("no stream address")
	}
	if _, _, st := streamHello(t, addr, "wrong", ""); st != 1 {
		t.Errorf("wrong token: status %d, want refused", st)
	}
	if _, _, st := streamHello(t, addr, "tok", "nope"); st != 1 {
		t.Errorf("unknown namespace: status %d, want refused", st)
	}
	c := e.dial(t, e.unix)
	k := key(1)
	data := make([]byte, slotSize)
	data[7] = 42
	if _, err := c.PutBlocks(ctxT(t), []client.Block{{Key: k, Data: data}}, client.CallOptions{}); err != nil {
		t.Fatal(err)
	}
	conn, r, st := streamHello(t, addr, "tok", "")
	if st != 0 {
		t.Fatalf("hello status %d", st)
	}
	req := binary.BigEndian.AppendUint32(nil, 2)
	for _, kk := range [][]byte{[]byte(k), []byte(key(2))} {
		req = binary.BigEndian.AppendUint16(req, uint16(len(kk)))
		req = append(req, kk...)
	}
	if _, err := conn.Write(req); err != nil {
		t.Fatal(err)
	}
	found, _ := r.ReadByte()
	var hdr [4]byte
	io.ReadFull(r, hdr[:])
	got := make([]byte, binary.BigEndian.Uint32(hdr[:]))
	io.ReadFull(r, got)
	var sum [8]byte
	io.ReadFull(r, sum[:])
	miss, err := r.ReadByte()
	if found != 1 || len(got) != slotSize || got[7] != 42 || binary.BigEndian.Uint64(sum[:]) != blockstream.Sum(got) || miss != 0 || err != nil {
		t.Fatalf("answer: found %d len %d byte %d, then %d (%v)", found, len(got), got[7], miss, err)
	}
	// A request beyond the key limit ends the connection.
	if _, err := conn.Write(binary.BigEndian.AppendUint32(nil, 1<<30)); err != nil {
		t.Fatal(err)
	}
	if _, err := r.ReadByte(); err == nil {
		t.Fatal("connection still open after an oversized request")
	}
	// An idle stream connection does not hold Shutdown up.
	idle, _, _ := streamHello(t, addr, "tok", "")
	_ = idle
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	if err := e.srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("shutdown took %v with an idle stream connection", d)
	}
}

// Puts on the block stream store what arrives whole, reject what does
// not (never visible), skip what the primary holds, and abandon every
// reservation of a put whose connection dies.
func TestBlockStreamPut(t *testing.T) {
	e := startEnv(t, envOptions{slots: 8, tiers: noTiers, token: "tok", stream: true})
	ctx := ctxT(t)
	api := e.dial(t, e.unix)
	st, err := client.DialStream(ctx, e.srv.StreamAddr(), client.StreamOptions{Token: "tok"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	deadline := time.Now().Add(time.Minute)
	res, err := st.Put([]client.Block{{Key: key(1), Data: block(key(1))}, {Key: key(2), Data: block(key(2))}, {Key: key(1), Data: block(key(1))}}, deadline)
	if err != nil || res[0] != client.PutStored || res[1] != client.PutStored || res[2] != client.PutPresent {
		t.Fatalf("put: %v %v", res, err)
	}
	// Stored again: present; of another size: rejected.
	res, err = st.Put([]client.Block{{Key: key(2), Data: block(key(2))}, {Key: key(3), Data: make([]byte, slotSize/2)}}, deadline)
	if err != nil || res[0] != client.PutPresent || res[1] != client.PutRejected {
		t.Fatalf("second put: %v %v", res, err)
	}
	got, err := api.GetBlocks(ctx, []offload.Key{key(1), key(2), key(3)}, client.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Results[0] != kvtierv1.LookupResult_LOOKUP_RESULT_HIT || !bytes.Equal(got.Data[0], block(key(1))) ||
		!bytes.Equal(got.Data[1], block(key(2))) || got.Results[2] == kvtierv1.LookupResult_LOOKUP_RESULT_HIT {
		t.Fatalf("after the puts: %v", got.Results)
	}

	// Damaged on the way: the checksum the client sent does not match
	// the bytes — rejected, never visible.
	conn, r, hs := streamHello(t, e.srv.StreamAddr(), "tok", "")
	if hs != 0 {
		t.Fatalf("hello %d", hs)
	}
	k := key(4)
	req := binary.BigEndian.AppendUint32(nil, 1|1<<31)
	req = binary.BigEndian.AppendUint16(req, uint16(len(k)))
	req = append(req, k...)
	req = binary.BigEndian.AppendUint32(req, slotSize)
	req = append(req, block(k)...)
	req = binary.BigEndian.AppendUint64(req, blockstream.Sum(block(k))^1)
	if _, err := conn.Write(req); err != nil {
		t.Fatal(err)
	}
	if s, err := r.ReadByte(); err != nil || s != byte(client.PutRejected) {
		t.Fatalf("damaged block: status %d %v", s, err)
	}
	// A put cut off in the middle of its block: nothing stored, no slot
	// left reserved.
	k = key(5)
	req = binary.BigEndian.AppendUint32(nil, 1|1<<31)
	req = binary.BigEndian.AppendUint16(req, uint16(len(k)))
	req = append(req, k...)
	req = binary.BigEndian.AppendUint32(req, slotSize)
	req = append(req, block(k)[:slotSize/2]...)
	if _, err := conn.Write(req); err != nil {
		t.Fatal(err)
	}
	conn.Close()
	rt.Eventually(t, 30*time.Second, "the reservation released", func() bool {
		s, err := api.Stats(ctx)
		return err == nil && s.GetPrimary().GetPendingSlots() == 0
	})
	got, err = api.GetBlocks(ctx, []offload.Key{key(4), key(5)}, client.GetOptions{})
	if err != nil || got.Results[0] == kvtierv1.LookupResult_LOOKUP_RESULT_HIT || got.Results[1] == kvtierv1.LookupResult_LOOKUP_RESULT_HIT {
		t.Fatalf("damaged or cut-off blocks visible: %v %v", got.Results, err)
	}
	// And the primary still takes them whole.
	res, err = st.Put([]client.Block{{Key: key(4), Data: block(key(4))}, {Key: key(5), Data: block(key(5))}}, deadline)
	if err != nil || res[0] != client.PutStored || res[1] != client.PutStored {
		t.Fatalf("put after: %v %v", res, err)
	}
}

// A client's by-value calls give the same answers on every path — the
// API over the Unix socket or TCP, the block stream — for hits and misses,
// prefix-only reads, caller buffers and every refusal (its gRPC code).
func TestByValueAnswersAlike(t *testing.T) {
	transcripts := make([]string, len(byValuePaths))
	for p, path := range byValuePaths {
		e := startEnv(t, envOptions{slots: 8, tiers: noTiers, stream: true, limits: server.Limits{MaxKeysPerCall: 16, MaxMessageBytes: 64<<10 + 4*slotSize}})
		c := e.dialVia(t, path)
		ctx := ctxT(t)
		var log strings.Builder
		put := func(what string, ks []offload.Key, size int, params string) {
			blocks := make([]client.Block, len(ks))
			for i, k := range ks {
				blocks[i] = client.Block{Key: k, Data: block(k)[:size]}
			}
			stored, err := c.PutBlocks(ctx, blocks, client.CallOptions{Params: params})
			fmt.Fprintf(&log, "put %s: %v %v\n", what, stored, status.Code(err))
		}
		get := func(what string, ks []offload.Key, o client.GetOptions) {
			got, err := c.GetBlocks(ctx, ks, o)
			fmt.Fprintf(&log, "get %s: %v hits %d %v;", what, got.Results, got.Hits, status.Code(err))
			for i, d := range got.Data {
				switch {
				case d == nil:
					log.WriteString(" -")
				case !bytes.Equal(d, block(ks[i])):
					log.WriteString(" wrong")
				case o.Buffers != nil && &d[0] != &o.Buffers[i][0]:
					log.WriteString(" copied")
				default:
					log.WriteString(" ok")
				}
			}
			log.WriteString("\n")
		}
		put("new", keys(0, 3), slotSize, "")
		put("some present", keys(1, 3), slotSize, `{"kv_store_tiers": []}`)
		put("short block", keys(10, 1), 1, "")
		put("repeated key", []offload.Key{key(11), key(11)}, slotSize, "")
		put("no room", keys(20, 9), slotSize, "")
		put("bad params", keys(30, 1), slotSize, `{"kv_store_tiers": 7`)
		put("too many", keys(40, 17), slotSize, "")
		ks := []offload.Key{key(0), key(50), key(1), key(2)}
		get("mixed", ks, client.GetOptions{})
		get("prefix only", ks, client.GetOptions{PrefixOnly: true})
		bufs := make([][]byte, len(ks))
		for i := range bufs {
			bufs[i] = make([]byte, slotSize)
		}
		get("into buffers", ks, client.GetOptions{Buffers: bufs})
		short := make([][]byte, len(ks))
		for i := range short {
			short[i] = make([]byte, slotSize/2)
		}
		get("into buffers too short", ks, client.GetOptions{Buffers: short})
		get("bad params", ks, client.GetOptions{CallOptions: client.CallOptions{Params: `[`}})
		get("too many", keys(0, 17), client.GetOptions{})
		get("more than a message holds", keys(0, 5), client.GetOptions{})
		get("none", nil, client.GetOptions{})
		transcripts[p] = log.String()
		if p > 0 && transcripts[p] != transcripts[0] {
			t.Errorf("%s answers\n%s\n%s answers\n%s", byValuePaths[0], transcripts[0], path, transcripts[p])
		}
		const refused = `kvtier_stream_requests_total{kind="put_blocks",result="failed"}`
		m := scrape(t, e)
		if path == "tcp-stream" {
			m = scrapeUntil(t, e, func(m string) bool { return strings.Contains(m, refused) })
		}
		onStream := strings.Contains(m, refused)
		if onStream != (path == "tcp-stream") {
			t.Errorf("%s: refusals answered on the block stream: %v", path, onStream)
		}
	}
	t.Logf("answers on every path:\n%s", transcripts[0])
}

// One client's by-value calls from many goroutines share its stream pool:
// every call gets its own connection or an idle one, and every answer is
// right.
func TestByValueConcurrentCallsOnTheStream(t *testing.T) {
	e := startEnv(t, envOptions{slots: 64, tiers: noTiers, stream: true})
	c := e.dialVia(t, "tcp-stream")
	ctx := ctxT(t)
	errs := make(chan error, 8)
	for g := range 8 {
		go func() {
			errs <- func() error {
				for i := range 20 {
					ks := keys(1000*g+3*i, 3)
					blocks := make([]client.Block, len(ks))
					for j, k := range ks {
						blocks[j] = client.Block{Key: k, Data: block(k)}
					}
					if _, err := c.PutBlocks(ctx, blocks, client.CallOptions{}); err != nil {
						return fmt.Errorf("put: %w", err)
					}
					got, err := c.GetBlocks(ctx, ks, client.GetOptions{})
					if err != nil {
						return fmt.Errorf("get: %w", err)
					}
					for j := range ks {
						// Other goroutines' puts may have evicted a block:
						// a miss is fine, other bytes never.
						if got.Data[j] != nil && !bytes.Equal(got.Data[j], block(ks[j])) {
							return fmt.Errorf("%v: other bytes", ks[j])
						}
					}
				}
				return nil
			}()
		}()
	}
	for range 8 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	const all = `kvtier_stream_requests_total{kind="get_blocks",result="ok"} 160` + "\n"
	if m := scrapeUntil(t, e, func(m string) bool { return strings.Contains(m, all) }); !strings.Contains(m, all) {
		t.Errorf("not every get went over the stream:\n%s", grepStream(m))
	}
}

// grepStream returns the block-stream series of a /metrics page.
func grepStream(m string) string {
	var out []string
	for l := range strings.SplitSeq(m, "\n") {
		if strings.HasPrefix(l, "kvtier_stream_") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// A block's stream checksum is remembered by slot and generation: a get
// after a put, or after another get, sends the remembered sum; once the
// slot holds another block — another key, or the same key with other
// bytes — the sum is computed again, so every get verifies (with a sum
// remembered by slot alone, the last get below would arrive corrupt).
func TestBlockStreamSumsFollowTheSlot(t *testing.T) {
	e := startEnv(t, envOptions{slots: 1, tiers: noTiers, stream: true})
	ctx := ctxT(t)
	api := e.dial(t, e.unix)
	st, err := client.DialStream(ctx, e.srv.StreamAddr(), client.StreamOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	deadline := time.Now().Add(time.Minute)
	get := func(what string, k offload.Key, want []byte) {
		t.Helper()
		for range 2 { // the second get sends the sum the first remembered
			dst := make([]byte, slotSize)
			res, err := st.Get([]offload.Key{k}, func(int) []byte { return dst }, deadline)
			if err != nil || len(res) != 1 || res[0] != client.StreamLoaded || !bytes.Equal(dst, want) {
				t.Fatalf("%s: get %v: %v %v", what, k, res, err)
			}
		}
		// The daemon unpins a get's slots once it has sent them, which a
		// client can see after it has the whole reply: the put that
		// follows needs the one slot free.
		for {
			stats, err := api.Stats(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if stats.GetPrimary().GetPinnedSlots() == 0 {
				break
			}
			time.Sleep(time.Millisecond)
		}
	}
	// Arrived on the stream: its sum is known.
	if res, err := st.Put([]client.Block{{Key: key(1), Data: block(key(1))}}, deadline); err != nil || res[0] != client.PutStored {
		t.Fatalf("put: %v %v", res, err)
	}
	get("after a stream put", key(1), block(key(1)))
	// The one slot is given another block, over the API.
	if _, err := api.PutBlocks(ctx, []client.Block{{Key: key(2), Data: block(key(2))}}, client.CallOptions{}); err != nil {
		t.Fatal(err)
	}
	get("another key in the slot", key(2), block(key(2)))
	// The first key again, with other bytes (an engine whose kernels are
	// not deterministic).
	other := bytes.Repeat([]byte{0xA5}, slotSize)
	if _, err := api.PutBlocks(ctx, []client.Block{{Key: key(1), Data: other}}, client.CallOptions{}); err != nil {
		t.Fatal(err)
	}
	get("the same key with other bytes", key(1), other)
}

// The block stream holds at most max_connections open: a connection
// beyond it waits, unanswered, until one closes.
func TestBlockStreamConnectionLimit(t *testing.T) {
	const limit = 4 // the least FitConnections allows
	e := startEnv(t, envOptions{slots: 8, tiers: noTiers, stream: true, limits: server.Limits{MaxConnections: limit}})
	addr := e.srv.StreamAddr()
	var open []net.Conn
	for range limit {
		c, _, st := streamHello(t, addr, "", "")
		if st != 0 {
			t.Fatalf("hello %d: status %d, want accepted", len(open), st)
		}
		open = append(open, c)
	}
	extra, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Close()
	if _, err := extra.Write([]byte("KVBS\x01\x00\x00\x00\x00")); err != nil {
		t.Fatal(err)
	}
	// A hello at the limit would be answered in well under this; a pass
	// here can be late, never wrong.
	var reply [5]byte
	_ = extra.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if n, err := extra.Read(reply[:]); n > 0 || err == nil {
		t.Fatalf("a connection beyond the limit of %d was answered (%d bytes)", limit, n)
	}
	open[0].Close()
	_ = extra.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(extra, reply[:]); err != nil || string(reply[:]) != "KVBS\x00" {
		t.Fatalf("after one closed, the waiting connection got %q, %v", reply, err)
	}
}

// A peer that asks for blocks and then reads a trickle held the pinned
// slots for as long as each block arrived within the stream timeout: a
// request has a deadline of its own (stream_request_timeout plus its bytes
// at stream_min_rate), past which the connection is cut and the pins go.
func TestStreamRequestsHaveADeadline(t *testing.T) {
	const size = 1 << 20
	e := startEnvSlot(t, envOptions{slots: 80, tiers: noTiers, stream: true,
		limits: server.Limits{StreamRequestTimeout: time.Second, StreamMinRate: 1 << 30}}, size)
	ctx := ctxT(t)
	c := e.dialVia(t, "unix")
	ks := keys(0, 64)
	blocks := make([]client.Block, len(ks))
	for i, k := range ks {
		blocks[i] = client.Block{Key: k, Data: bytes.Repeat([]byte{byte(i)}, size)}
	}
	for i := 0; i < len(blocks); i += 16 {
		if _, err := c.PutBlocks(ctx, blocks[i:i+16], client.CallOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// A get of 64 MiB, more than the sockets' buffers, never read.
	conn, _, hs := streamHello(t, e.srv.StreamAddr(), "", "")
	if hs != 0 {
		t.Fatalf("hello %d", hs)
	}
	defer conn.Close()
	req := binary.BigEndian.AppendUint32(nil, uint32(len(ks)))
	for _, k := range ks {
		req = binary.BigEndian.AppendUint16(req, uint16(len(k)))
		req = append(req, k...)
	}
	if _, err := conn.Write(req); err != nil {
		t.Fatal(err)
	}
	pinned := func() int64 {
		st, err := c.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return st.GetPrimary().GetPinnedSlots()
	}
	rt.Eventually(t, 10*time.Second, "the get pins its blocks", func() bool { return pinned() > 0 })
	rt.Eventually(t, 10*time.Second, "the unread get's pins released", func() bool { return pinned() == 0 })
}
