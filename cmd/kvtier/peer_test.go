package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	kvtierv1 "github.com/kvtier/kvtier/api/kvtier/v1"
	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/config"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/server"
)

// Three daemons built as `kvtier serve` builds them, on loopback TCP: A and
// C serve their DRAM; B's only tier is a peer tier over them.

type peerDaemon struct {
	name, dir, tcp string
	// metrics is server.metrics_addr ("" = off); events, if set, is an
	// events section.
	metrics, events string
	srv             *server.Server
	c               *client.Client
}

func startPeerDaemon(t *testing.T, name, tiers string) *peerDaemon {
	t.Helper()
	d := newPeerDaemon(t, name)
	d.start(t, tiers)
	return d
}

func newPeerDaemon(t *testing.T, name string) *peerDaemon {
	t.Helper()
	dir, err := os.MkdirTemp("", "kvp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return &peerDaemon{name: name, dir: dir, tcp: freeTCP(t)}
}

func (d *peerDaemon) start(t *testing.T, tiers string) { d.startWith(t, tiers, "") }

// startWith starts the daemon with more keys in its server section.
func (d *peerDaemon) startWith(t *testing.T, tiers, server string) {
	t.Helper()
	doc := fmt.Sprintf(`
namespace: {model: m, bytes_per_block: 4KiB}
primary: {bytes: 256KiB}
secondary_tiers: %s
server: {unix_socket: %s/k.sock, tcp_addr: %q, metrics_addr: %q%s}
%s
`, tiers, d.dir, d.tcp, d.metrics, server, d.events)
	cfg, err := config.Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	if d.srv, err = buildDaemon(context.Background(), cfg, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	if err := d.srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.stop)
	if d.c, err = client.Dial(filepath.Join(d.dir, "k.sock"), client.Options{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.c.Close() })
}

func (d *peerDaemon) stop() {
	if d.srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		d.srv.Shutdown(ctx)
		d.srv = nil
	}
}

func (d *peerDaemon) primaryLookups(t *testing.T) uint64 {
	t.Helper()
	st, err := d.c.Stats(ctxFor(t))
	if err != nil {
		t.Fatal(err)
	}
	return st.GetPrimary().GetLookups()
}

func (d *peerDaemon) get(t *testing.T, key offload.Key, params string) ([]byte, bool) {
	t.Helper()
	got, err := d.c.GetBlocks(ctxFor(t), []offload.Key{key}, client.GetOptions{CallOptions: client.CallOptions{Params: params}, Wait: 3 * time.Second})
	if err != nil {
		t.Fatalf("%s: get: %v", d.name, err)
	}
	if got.Results[0] != kvtierv1.LookupResult_LOOKUP_RESULT_HIT {
		return nil, false
	}
	return got.Data[0], true
}

func TestPeerTierAcrossThreeDaemons(t *testing.T) {
	a := startPeerDaemon(t, "A", "[]")
	// C reads from A; B reads from A (configured remote, as if on another
	// host) and from C (local: loopback).
	c := startPeerDaemon(t, "C", fmt.Sprintf(`[{name: fleet, type: peer, peers: [{name: a, addr: %q}]}]`, a.tcp))
	b := startPeerDaemon(t, "B", fmt.Sprintf(`[{name: fleet, type: peer, timeout: 1s, probe_interval: 100ms, peers: [
  {name: a, addr: %q, locality: remote}, {name: c, addr: %q}]}]`, a.tcp, c.tcp))

	block := bytes.Repeat([]byte{0xa5, 1, 2, 3}, 1024)
	key := offload.MakeKey([]byte("peer-block-0001"), 0)
	if _, err := a.c.PutBlocks(ctxFor(t), []client.Block{{Key: key, Data: block}}, client.CallOptions{}); err != nil {
		t.Fatal(err)
	}

	// A request that allows only local tiers: B asks C alone, and C,
	// asked by a peer, answers from its DRAM without asking A (no
	// forwarding): a miss, and A never hears of it.
	before := a.primaryLookups(t)
	if _, ok := b.get(t, key, `{"kv_load_tiers":[{"locality":"local"}]}`); ok {
		t.Fatal("local-only request loaded from the remote peer, or C forwarded to A")
	}
	if got := a.primaryLookups(t); got != before {
		t.Errorf("A was asked %d times for a local-only request of B", got-before)
	}
	// Storage only: a peer's blocks are in its DRAM.
	if _, ok := b.get(t, key, `{"kv_load_tiers":[{"medium":"storage"}]}`); ok {
		t.Fatal("storage-only request loaded a peer's DRAM block")
	}
	// CPU only, or any tier: B and C both load A's block, byte for byte.
	for _, d := range []*peerDaemon{b, c} {
		got, ok := d.get(t, key, `{"kv_load_tiers":[{"medium":"cpu"}]}`)
		if !ok || !bytes.Equal(got, block) {
			t.Fatalf("%s's load through its peer tier: hit %v, bytes equal %v", d.name, ok, bytes.Equal(got, block))
		}
	}

	// A dies: B's lookups of blocks no live peer holds miss, never fail.
	a.stop()
	third := offload.MakeKey([]byte("peer-block-0003"), 0)
	if _, ok := b.get(t, third, ""); ok {
		t.Fatal("hit for a block no live peer holds")
	}
	// A comes back (empty): B asks it again.
	a.start(t, "[]")
	if _, err := a.c.PutBlocks(ctxFor(t), []client.Block{{Key: third, Data: block}}, client.CallOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		got, ok := b.get(t, third, "")
		return ok && bytes.Equal(got, block)
	})
}

// A peer with another block size is a miss, never a torn or padded block;
// the operator commands work against a daemon whose only tier is a peer
// tier.
func TestPeerTierBlockSizeAndCLI(t *testing.T) {
	a := startPeerDaemon(t, "A", "[]")
	b := startPeerDaemon(t, "B", fmt.Sprintf(`[{name: fleet, type: peer, peers: [{name: a, addr: %q}]}]`, a.tcp))
	block := bytes.Repeat([]byte{7, 1, 2, 9}, 1024)
	key := offload.MakeKey([]byte("peer-cli-0001"), 0)
	if _, err := a.c.PutBlocks(ctxFor(t), []client.Block{{Key: key, Data: block}}, client.CallOptions{}); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(b.dir, "out.bin")
	code, _, stderr := runCLI(t, "", "get", "--target="+filepath.Join(b.dir, "k.sock"), "-o", out, key.String())
	if code != 0 {
		t.Fatalf("kvtier get through B: exit %d: %s", code, stderr)
	}
	if got, _ := os.ReadFile(out); !bytes.Equal(got, block) {
		t.Fatal("kvtier get through B: other bytes")
	}
	code, stdout, _ := runCLI(t, "", "lookup", "--target="+filepath.Join(b.dir, "k.sock"), key.String())
	if code != 0 || stdout == "" {
		t.Fatalf("kvtier lookup through B: exit %d, %q", code, stdout)
	}

	// D holds 8 KiB blocks: B (4 KiB) must miss, not copy part of one.
	d := &peerDaemon{name: "D", tcp: freeTCP(t)}
	var err error
	if d.dir, err = os.MkdirTemp("", "kvp"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d.dir) })
	cfg, err := config.Parse([]byte(fmt.Sprintf("namespace: {model: m, bytes_per_block: 8KiB}\nprimary: {bytes: 256KiB}\nserver: {unix_socket: %s/k.sock, tcp_addr: %q, metrics_addr: \"\"}\n", d.dir, d.tcp)))
	if err != nil {
		t.Fatal(err)
	}
	if d.srv, err = buildDaemon(context.Background(), cfg, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	if err := d.srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.stop)
	if d.c, err = client.Dial(filepath.Join(d.dir, "k.sock"), client.Options{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.c.Close() })
	big := offload.MakeKey([]byte("peer-big-0001"), 0)
	if _, err := d.c.PutBlocks(ctxFor(t), []client.Block{{Key: big, Data: bytes.Repeat([]byte{3}, 8192)}}, client.CallOptions{}); err != nil {
		t.Fatal(err)
	}
	e := startPeerDaemon(t, "E", fmt.Sprintf(`[{name: fleet, type: peer, peers: [{name: d, addr: %q}]}]`, d.tcp))
	if _, ok := e.get(t, big, ""); ok {
		t.Fatal("a 4 KiB daemon loaded an 8 KiB peer block")
	}
}

// flipProxy forwards TCP to upstream and, in the upstream → client
// direction, flips one byte of the first occurrence of pattern on each
// connection: a block damaged in transit, past TCP's checksums (a faulty
// NIC, a buggy middlebox).
func flipProxy(t *testing.T, upstream string, pattern []byte) string {
	t.Helper()
	return flipProxyOn(t, "127.0.0.1:0", upstream, pattern, true, false)
}

// flipProxyOn is flipProxy listening on addr, damaging the directions
// toClient and toUpstream say.
func flipProxyOn(t *testing.T, addr, upstream string, pattern []byte, toClient, toUpstream bool) string {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	// pipe copies src to dst, flipping a byte of the first pattern when
	// flip is set.
	pipe := func(dst, src net.Conn, flip bool) {
		defer dst.Close()
		buf := make([]byte, 64<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				if i := bytes.Index(buf[:n], pattern); i >= 0 && flip {
					buf[i+len(pattern)/2] ^= 0x10
					flip = false
				}
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", upstream)
			if err != nil {
				c.Close()
				continue
			}
			go pipe(u, c, toUpstream)
			go pipe(c, u, toClient)
		}
	}()
	return l.Addr().String()
}

// A block damaged between the peer and the tier on the API path
// (block_stream: false) is rejected by its checksum, counted, and a miss;
// an intact transfer afterwards hits.
func TestPeerTierRejectsBlocksDamagedInTransit(t *testing.T) {
	a := startPeerDaemon(t, "A", "[]")
	block := bytes.Repeat([]byte{0xa5, 0x5a, 0xc3, 0x3c, 1, 2, 3, 4}, 512)
	proxy := flipProxy(t, a.tcp, block[:64])
	b := startPeerDaemon(t, "B", fmt.Sprintf(`[{name: fleet, type: peer, peers: [{name: a, addr: %q, block_stream: false}]}]`, proxy))
	key := offload.MakeKey([]byte("peer-flip-0001"), 0)
	if _, err := a.c.PutBlocks(ctxFor(t), []client.Block{{Key: key, Data: block}}, client.CallOptions{}); err != nil {
		t.Fatal(err)
	}
	if got, ok := b.get(t, key, ""); ok {
		t.Fatalf("a damaged block was served (equal to the original: %v)", bytes.Equal(got, block))
	}
	wantCorruptCounted(t, b, 1)
	// The proxy damages one block per connection: the next load is whole.
	if got, ok := b.get(t, key, ""); !ok || !bytes.Equal(got, block) {
		t.Fatalf("second load: hit %v, bytes equal %v", ok, bytes.Equal(got, block))
	}
}

// wantCorruptCounted checks that d's first tier counted n damaged blocks.
func wantCorruptCounted(t *testing.T, d *peerDaemon, n uint64) {
	t.Helper()
	st, err := d.c.Stats(ctxFor(t))
	if err != nil {
		t.Fatal(err)
	}
	if got := st.GetTiers()[0].GetCorruptBlocks(); got != n {
		t.Fatalf("corrupt blocks %d, want %d", got, n)
	}
}

// startBehindProxies starts a daemon A (metrics on metricsAddr, "" for
// none) whose API and block stream listen on 127.0.0.2, with proxies on
// 127.0.0.1 in front of both, and returns it and its API proxy's address.
// The stream's proxy sits on the stream's port, so a client learning that
// port from A's Stats dials it on the host it reaches A's API by: the
// proxy. It damages the first occurrence of pattern on each connection in
// the directions toClient and toUpstream say; the API's proxy none.
func startBehindProxies(t *testing.T, metricsAddr string, pattern []byte, toClient, toUpstream bool) (*peerDaemon, string) {
	t.Helper()
	a, port := startOnSecondLoopback(t, metricsAddr)
	flipProxyOn(t, "127.0.0.1:"+port, "127.0.0.2:"+port, pattern, toClient, toUpstream)
	return a, flipProxy(t, a.tcp, []byte("no such pattern in the API traffic"))
}

// startOnSecondLoopback starts a daemon A whose API (a.tcp) and block
// stream listen on 127.0.0.2, the stream on a port that is free on
// 127.0.0.1 too (returned), for the caller to put something there.
func startOnSecondLoopback(t *testing.T, metricsAddr string) (*peerDaemon, string) {
	t.Helper()
	reserve, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(reserve.Addr().String())
	reserve.Close() // reserved the port number for the caller
	apiLn, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Skipf("127.0.0.2 is not usable here: %v", err)
	}
	apiAddr := apiLn.Addr().String()
	apiLn.Close()
	a := newPeerDaemon(t, "A")
	a.tcp, a.metrics = apiAddr, metricsAddr
	a.startWith(t, "[]", fmt.Sprintf(", stream_addr: %q", "127.0.0.2:"+port))
	return a, port
}

// The same on the block stream: A's API and stream listen on 127.0.0.2,
// proxies on 127.0.0.1 forward to them, the stream's proxy damaging one
// block. B learns the stream's port from A's Stats and dials it on the
// host it reaches A's API by, so both go through the proxies.
func TestPeerTierBlockStreamRejectsDamagedBlocks(t *testing.T) {
	block := bytes.Repeat([]byte{0x11, 0x22, 0x33, 0x44, 5, 6, 7, 8}, 512)
	a, api := startBehindProxies(t, "", block[:64], true, false)
	b := startPeerDaemon(t, "B", fmt.Sprintf(`[{name: fleet, type: peer, peers: [{name: a, addr: %q}]}]`, api))
	key := offload.MakeKey([]byte("stream-flip-0001"), 0)
	if _, err := a.c.PutBlocks(ctxFor(t), []client.Block{{Key: key, Data: block}}, client.CallOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, ok := b.get(t, key, ""); ok {
		t.Fatal("a block damaged on the stream was served")
	}
	wantCorruptCounted(t, b, 1)
	if got, ok := b.get(t, key, ""); !ok || !bytes.Equal(got, block) {
		t.Fatalf("second load over the stream: hit %v, bytes equal %v", ok, bytes.Equal(got, block))
	}
}

// A remote engine's by-value calls take the block stream; a block damaged
// on it, either way, is never stored or served: the client makes the call
// (a put: the damaged blocks) again through the API, the daemon counts
// the rejected block.
func TestByValueCallsSurviveDamageOnTheStream(t *testing.T) {
	block := bytes.Repeat([]byte{0x5a, 0x11, 0xee, 0x42, 9, 8, 7, 6}, 512)
	a, api := startBehindProxies(t, "127.0.0.1:0", block[:64], true, true)
	engine, err := client.Dial(api, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer engine.Close()
	key := offload.MakeKey([]byte("byvalue-flip-01"), 0)
	stored, err := engine.PutBlocks(ctxFor(t), []client.Block{{Key: key, Data: block}}, client.CallOptions{})
	if err != nil || !stored[0] {
		t.Fatalf("put: %v %v", stored, err)
	}
	got, err := a.c.GetBlocks(ctxFor(t), []offload.Key{key}, client.GetOptions{})
	if err != nil || got.Hits != 1 || !bytes.Equal(got.Data[0], block) {
		t.Fatalf("A holds other bytes than were put (hits %d, err %v)", got.Hits, err)
	}
	got, err = engine.GetBlocks(ctxFor(t), []offload.Key{key}, client.GetOptions{})
	if err != nil || got.Hits != 1 || !bytes.Equal(got.Data[0], block) {
		t.Fatalf("get through the damaging stream: hits %d, bytes equal %v, err %v", got.Hits, got.Hits == 1 && bytes.Equal(got.Data[0], block), err)
	}
	want := []string{
		`kvtier_stream_blocks_total{direction="in",result="rejected"} 1`,
		`kvtier_stream_requests_total{kind="put_blocks",result="ok"} 1`,
		`kvtier_stream_blocks_total{direction="out",result="ok"} 1`,
		`kvtier_api_calls_total{code="OK",method="PutBlocks"} 1`,
		`kvtier_api_calls_total{code="OK",method="GetBlocks"} 2`,
	}
	// The daemon counts a call after answering it: wait for the counters.
	m := scrapeDaemonUntil(t, a, func(m string) bool {
		for _, series := range want {
			if !strings.Contains(m, series+"\n") {
				return false
			}
		}
		return true
	})
	for _, series := range want {
		if !strings.Contains(m, series+"\n") {
			t.Errorf("/metrics lacks %s:\n%s", series, grepLines(m, "kvtier_stream_"))
		}
	}
}

// A stream the client cannot use (here: something on its port that hangs
// up) leaves the by-value calls on the API, with the right answers, and
// is not tried again for every call.
func TestByValueCallsWithoutAUsableStream(t *testing.T) {
	a, port := startOnSecondLoopback(t, "")
	l, err := net.Listen("tcp", "127.0.0.1:"+port)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var dials atomic.Int32
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			dials.Add(1)
			c.Close()
		}
	}()
	engine, err := client.Dial(flipProxy(t, a.tcp, []byte("no such pattern in the API traffic")), client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer engine.Close()
	block := bytes.Repeat([]byte{4, 3, 2, 1}, 1024)
	start := time.Now()
	for i := range 3 {
		key := offload.MakeKey([]byte(fmt.Sprintf("no-stream-%02d", i)), 0)
		if stored, err := engine.PutBlocks(ctxFor(t), []client.Block{{Key: key, Data: block}}, client.CallOptions{}); err != nil || !stored[0] {
			t.Fatalf("put %d: %v %v", i, stored, err)
		}
		got, err := engine.GetBlocks(ctxFor(t), []offload.Key{key}, client.GetOptions{})
		if err != nil || got.Hits != 1 || !bytes.Equal(got.Data[0], block) {
			t.Fatalf("get %d: hits %d, err %v", i, got.Hits, err)
		}
	}
	// Once per retry delay (10 s) at most: once, unless this machine took
	// that long for six calls.
	if n, most := dials.Load(), 1+int32(time.Since(start)/(10*time.Second)); n < 1 || n > most {
		t.Fatalf("the stream was dialled %d times in six calls over %v, want 1 to %d", n, time.Since(start), most)
	}
}

// scrapeDaemon returns d's /metrics page.
func scrapeDaemon(t *testing.T, d *peerDaemon) string {
	t.Helper()
	resp, err := http.Get("http://" + d.srv.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(body)
}

// scrapeDaemonUntil returns d's /metrics page once cond holds for it, or
// the last page scraped after a bound.
func scrapeDaemonUntil(t *testing.T, d *peerDaemon, cond func(page string) bool) string {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		m := scrapeDaemon(t, d)
		if cond(m) || time.Now().After(deadline) {
			return m
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A daemon whose peer publishes its KV events answers lookups for that
// peer from its event index, says so in /metrics, and loads through it.
func TestPeerEventIndexDaemons(t *testing.T) {
	a := newPeerDaemon(t, "A")
	a.events = `events: {enabled: true, endpoint: "tcp://*:0", replay_endpoint: "tcp://*:0"}`
	a.start(t, "[]")
	b := newPeerDaemon(t, "B")
	b.metrics = "127.0.0.1:0"
	b.start(t, fmt.Sprintf(`[{name: fleet, type: peer, resync_interval: 100ms, peers: [{name: a, addr: %q}]}]`, a.tcp))
	block := bytes.Repeat([]byte{9, 8, 7, 6}, 1024)
	key := offload.MakeKey([]byte("indexed-block-01"), 0)
	if _, err := a.c.PutBlocks(ctxFor(t), []client.Block{{Key: key, Data: block}}, client.CallOptions{}); err != nil {
		t.Fatal(err)
	}
	waitNodeIndex(t, b, "a", "1")
	got, ok := b.get(t, key, "")
	if !ok || !bytes.Equal(got, block) {
		t.Fatalf("load through the index: hit %v", ok)
	}

	// A restarts (empty, its events on a new port): B's index goes cold,
	// passes over A's blocks again and follows the new publisher.
	a.stop()
	a.start(t, "[]")
	second := offload.MakeKey([]byte("indexed-block-02"), 0)
	third := offload.MakeKey([]byte("indexed-block-03"), 0)
	if _, err := a.c.PutBlocks(ctxFor(t), []client.Block{{Key: second, Data: block}, {Key: third, Data: block}}, client.CallOptions{}); err != nil {
		t.Fatal(err)
	}
	// Two blocks: only the new A's publisher can say so.
	waitNodeIndex(t, b, "a", "2")
	if got, ok := b.get(t, second, ""); !ok || !bytes.Equal(got, block) {
		t.Fatalf("B's load from the restarted A: hit %v", ok)
	}
}

// waitNodeIndex waits until d's /metrics says its peer tier's index of
// node is current and holds blocks blocks.
func waitNodeIndex(t *testing.T, d *peerDaemon, node, blocks string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		m := scrapeDaemon(t, d)
		if nodeMetric(m, "kvtier_tier_node_indexed", node) == "1" && nodeMetric(m, "kvtier_tier_node_index_blocks", node) == blocks {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("index of %s never current with %s blocks:\n%s", node, blocks, grepLines(m, "node_index"))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// nodeMetric returns the value of metric name for node in a /metrics
// page ("" when absent).
func nodeMetric(page, name, node string) string {
	for l := range strings.SplitSeq(page, "\n") {
		if strings.HasPrefix(l, name+"{") && strings.Contains(l, `node="`+node+`"`) {
			return l[strings.LastIndexByte(l, ' ')+1:]
		}
	}
	return ""
}

func grepLines(s, sub string) string {
	var out []string
	for l := range strings.SplitSeq(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// A peer back after an outage is used again as soon after a long outage
// as after a short one: the peer tier's reconnects never back off past
// probe_interval (gRPC's own backoff grows to two minutes). Both outages
// are waited out on events (the first hit after the restart); the times
// are logged for BENCHMARKS-style records, not asserted.
func TestPeerRecoveryIndependentOfOutageLength(t *testing.T) {
	block := bytes.Repeat([]byte{7, 7, 7, 7}, 1024)
	keyOf := func(i int) offload.Key { return offload.MakeKey(fmt.Appendf(nil, "peer-recovery-%04d", i), 0) }
	a := startPeerDaemon(t, "A", "[]")
	put := func(k offload.Key) {
		t.Helper()
		if _, err := a.c.PutBlocks(ctxFor(t), []client.Block{{Key: k, Data: block}}, client.CallOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	put(keyOf(0))
	b := startPeerDaemon(t, "B", fmt.Sprintf(`[{name: fleet, type: peer, timeout: 500ms, unhealthy_after: 1, probe_interval: 100ms,
  peers: [{name: a, addr: %q}]}]`, a.tcp))
	if _, ok := b.get(t, keyOf(0), ""); !ok {
		t.Fatal("no hit before the outage")
	}
	for i, outage := range []time.Duration{300 * time.Millisecond, 6 * time.Second} {
		// Each round's block is new: B's own primary holds the earlier ones.
		k := keyOf(i + 1)
		a.stop()
		deadline := time.Now().Add(outage)
		for time.Now().Before(deadline) { // B keeps asking (and failing) all through the outage
			if _, ok := b.get(t, k, ""); ok {
				t.Fatal("a hit for a block no daemon holds")
			}
			time.Sleep(50 * time.Millisecond)
		}
		a.start(t, "[]")
		put(k)
		back := time.Now()
		for {
			if _, ok := b.get(t, k, ""); ok {
				break
			}
			if time.Since(back) > time.Minute {
				t.Fatalf("after a %v outage the peer is not used again a minute after it is back", outage)
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Logf("outage %v: the peer is used again %v after it is back", outage, time.Since(back).Round(time.Millisecond))
	}
}
