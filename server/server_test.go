package server_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	kvtierv1 "github.com/kvtier/kvtier/api/kvtier/v1"
	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/cpu"
	"github.com/kvtier/kvtier/events"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/server"
	"github.com/kvtier/kvtier/tiering"
	"github.com/kvtier/kvtier/tiers/memory"
)

const slotSize = 256

// env is a running daemon with one namespace: a memfd primary of `slots`
// slots in front of two memory tiers, "remote-cpu" (CPU, REMOTE) and
// "local-disk" (STORAGE, LOCAL).
type env struct {
	srv   *server.Server
	prim  *cpu.Primary
	unix  string
	tcp   string
	token string
	dir   string
	pub   *events.Publisher // with envOptions.publish
}

type envOptions struct {
	slots  int
	token  string
	parser offload.Parser
	limits server.Limits
	tiers  func(t envT) []offload.SecondaryTier
	// arena defaults to a memfd arena.
	arena cpu.ArenaConfig
	// events, if set, receives every step's events.
	events server.EventSink
	// logger defaults to a logger that discards.
	logger *slog.Logger
	// stream serves a block stream on a free loopback port.
	stream bool
	// publish publishes the namespace's KV events on free loopback ports
	// with replay (replaySteps batches kept, default vLLM's); feed, if
	// set, rewrites what ListBlocks says about them.
	publish     bool
	replaySteps int
	tracker     events.TrackerConfig // the publisher's
	feed        func(server.EventFeed) server.EventFeed
	// tenants, shared and shares: the daemon's tenants, shared spaces and
	// the primary's shares.
	tenants []server.TenantConfig
	shared  []server.SharedSpaceConfig
	shares  []cpu.Share
	// unixPeers: who token-less Unix callers are, by uid.
	unixPeers map[int]string
	// prefetch bounds the namespace's prefetches.
	prefetch tiering.PrefetchConfig
}

// envT is what starting an env needs of a test: a *testing.T, a
// *testing.B or a *rapid.T (a model test starts a daemon per case).
type envT interface {
	Fatal(args ...any)
	Fatalf(format string, args ...any)
	Errorf(format string, args ...any)
	Cleanup(func())
}

func memTiers(t envT) []offload.SecondaryTier {
	a, err := memory.New(memory.Config{Name: "remote-cpu", Medium: offload.MediumCPU, Locality: offload.LocalityRemote})
	if err != nil {
		t.Fatal(err)
	}
	b, err := memory.New(memory.Config{Name: "local-disk", Medium: offload.MediumStorage, Locality: offload.LocalityLocal, Latency: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return []offload.SecondaryTier{a, b}
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func startEnv(t envT, o envOptions) *env {
	return startEnvSlot(t, o, slotSize)
}

// startEnvSlot starts a daemon whose blocks are size bytes.
func startEnvSlot(t envT, o envOptions, size int) *env {
	if o.slots == 0 {
		o.slots = 64
	}
	if o.tiers == nil {
		o.tiers = memTiers
	}
	// Short directory: Unix socket paths are limited to 108 bytes.
	dir, err := os.MkdirTemp("", "kvt")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if o.arena.Kind == "" {
		o.arena.Kind = cpu.ArenaMemfd
	}
	if o.logger == nil {
		o.logger = quietLogger()
	}
	e := &env{}
	p, err := cpu.New(cpu.Config{SlotSize: size, Capacity: int64(size * o.slots), Arena: o.arena, Events: true, Shares: o.shares})
	if err != nil {
		t.Fatal(err)
	}
	m, err := tiering.New(tiering.Config{Primary: p, Tiers: o.tiers(t), Logger: quietLogger(), Prefetch: o.prefetch})
	if err != nil {
		t.Fatal(err)
	}
	nc := server.ManagerNamespace("", m, p, o.parser)
	nc.Events = o.events
	if o.publish {
		pub, err := events.New(events.Config{Endpoint: "tcp://127.0.0.1:0", Mode: events.ModeBind, ReplayEndpoint: "tcp://127.0.0.1:0",
			BufferSteps: o.replaySteps, Model: "m", Logger: quietLogger(), Tracker: o.tracker})
		if err != nil {
			t.Fatal(err)
		}
		nc = server.WithPublisher(nc, pub)
		e.pub = pub
	}
	if o.feed != nil {
		f := nc.Feed
		nc.Feed = func() server.EventFeed { return o.feed(f()) }
	}
	streamAddr := ""
	if o.stream {
		streamAddr = "127.0.0.1:0"
	}
	srv, err := server.New(server.Config{
		StreamAddr:   streamAddr,
		Namespaces:   []server.NamespaceConfig{nc},
		UnixSocket:   filepath.Join(dir, "k.sock"),
		TCPAddr:      "127.0.0.1:0",
		MetricsAddr:  "127.0.0.1:0",
		AuthToken:    o.token,
		Tenants:      o.tenants,
		SharedSpaces: o.shared,
		UnixPeers:    o.unixPeers,
		Limits:       o.limits,
		Logger:       o.logger,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	e.srv, e.prim, e.unix, e.tcp, e.token, e.dir = srv, p, srv.UnixAddr(), srv.TCPAddr(), o.token, dir
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	return e
}

func (e *env) dial(t testing.TB, target string) *client.Client {
	t.Helper()
	c, err := client.Dial(target, client.Options{Token: e.token})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func key(i int) offload.Key { return offload.MakeKey([]byte(fmt.Sprintf("hash-%04d", i)), 0) }

func keys(from, n int) []offload.Key {
	out := make([]offload.Key, n)
	for i := range out {
		out[i] = key(from + i)
	}
	return out
}

func block(k offload.Key) []byte {
	return bytes.Repeat([]byte(k.Hash()[:8]), slotSize/8)
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func wantCode(t *testing.T, err error, code codes.Code, substr string) {
	t.Helper()
	if status.Code(err) != code {
		t.Fatalf("got %v, want code %v", err, code)
	}
	if substr != "" && !strings.Contains(status.Convert(err).Message(), substr) {
		t.Fatalf("error %q does not mention %q", status.Convert(err).Message(), substr)
	}
}

// storeViaArena runs the engine's store protocol with direct slot writes.
func storeViaArena(t *testing.T, ctx context.Context, c *client.Client, a *client.Arena, id string, ks []offload.Key) {
	t.Helper()
	res, err := c.PrepareStore(ctx, id, ks, nil)
	if err != nil || !res.OK {
		t.Fatalf("PrepareStore: ok=%v err=%v", res.OK, err)
	}
	for i, k := range res.Keys {
		dst, err := a.Slot(res.Slots[i])
		if err != nil {
			t.Fatal(err)
		}
		copy(dst, block(k))
	}
	if err := c.CompleteStore(ctx, id, res.Keys, true); err != nil {
		t.Fatalf("CompleteStore: %v", err)
	}
}

// lookupUntil ends steps until every key answers HIT.
func lookupUntil(t *testing.T, ctx context.Context, c *client.Client, id string, ks []offload.Key) {
	t.Helper()
	for i := 0; ; i++ {
		res, hits, err := c.Lookup(ctx, id, ks, false)
		if err != nil {
			t.Fatal(err)
		}
		if hits == len(ks) && allHit(res) {
			return
		}
		if i > 2000 {
			t.Fatalf("keys never became readable: %v", res)
		}
		if _, err := c.ScheduleEnd(ctx, nil, nil); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond)
	}
}

func allHit(res []kvtierv1.LookupResult) bool {
	for _, r := range res {
		if r != kvtierv1.LookupResult_LOOKUP_RESULT_HIT {
			return false
		}
	}
	return true
}

// TestEndToEnd runs the engine protocol (store into mapped slots, lookup,
// load, reset, promotion from a secondary tier, filters) over both
// transports.
func TestEndToEnd(t *testing.T) {
	e := startEnv(t, envOptions{token: "s3cret"})
	for _, tc := range []struct{ name, target string }{{"unix", e.unix}, {"tcp", e.tcp}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := ctxT(t)
			c := e.dial(t, tc.target)
			a, err := c.MapArena(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			if a.SlotSize() != slotSize || a.NumSlots() != 64 {
				t.Fatalf("arena %d×%d", a.NumSlots(), a.SlotSize())
			}
			if err := c.Reset(ctx); err != nil {
				t.Fatal(err)
			}
			ks := keys(0, 8)
			id := "req-store-" + tc.name
			nr, err := c.NewRequest(ctx, id, "")
			if err != nil {
				t.Fatal(err)
			}
			if !nr.GetLoadFilter().GetAll() || nr.GetLoadFromRequest() {
				t.Fatalf("default filter: %v", nr)
			}
			storeViaArena(t, ctx, c, a, id, ks)
			res, hits, err := c.Lookup(ctx, id, ks, true)
			if err != nil || hits != len(ks) || !allHit(res) {
				t.Fatalf("lookup after store: hits=%d res=%v err=%v", hits, res, err)
			}
			slots, err := c.PrepareLoad(ctx, id, ks)
			if err != nil {
				t.Fatal(err)
			}
			for i, s := range slots {
				got, _ := a.Slot(s)
				if !bytes.Equal(got, block(ks[i])) {
					t.Fatalf("slot %d of %s holds the wrong bytes", s, ks[i])
				}
			}
			if err := c.CompleteLoad(ctx, id, ks); err != nil {
				t.Fatal(err)
			}
			if err := c.FinishRequest(ctx, id); err != nil {
				t.Fatal(err)
			}
			// Let the cascades to both tiers finish.
			for pending := true; pending; {
				if pending, err = c.ScheduleEnd(ctx, nil, nil); err != nil {
					t.Fatal(err)
				}
				time.Sleep(time.Millisecond)
			}

			if err := c.Reset(ctx); err != nil {
				t.Fatal(err)
			}
			// Deny every secondary tier: the reset primary has nothing.
			deny := "deny-" + tc.name
			if _, err := c.NewRequest(ctx, deny, `{"kv_load_tiers": []}`); err != nil {
				t.Fatal(err)
			}
			res, hits, err = c.Lookup(ctx, deny, ks, false)
			if err != nil || hits != 0 || res[0] != kvtierv1.LookupResult_LOOKUP_RESULT_MISS {
				t.Fatalf("lookup with kv_load_tiers []: hits=%d res=%v err=%v", hits, res, err)
			}
			if err := c.FinishRequest(ctx, deny); err != nil {
				t.Fatal(err)
			}

			// Load only from local storage: promotion from local-disk.
			load := "load-" + tc.name
			nr, err = c.NewRequest(ctx, load, `{"kv_load_tiers": [{"medium": "storage", "locality": "local"}]}`)
			if err != nil {
				t.Fatal(err)
			}
			if len(nr.GetLoadFilter().GetMatchers()) != 1 || nr.GetLoadFilter().GetMatchers()[0].GetMedium() != kvtierv1.Medium_MEDIUM_STORAGE {
				t.Fatalf("parsed filter: %v", nr.GetLoadFilter())
			}
			res, _, err = c.Lookup(ctx, load, ks, true)
			if err != nil || res[0] != kvtierv1.LookupResult_LOOKUP_RESULT_RETRY {
				t.Fatalf("first lookup after reset: %v %v", res, err)
			}
			lookupUntil(t, ctx, c, load, ks)
			slots, err = c.PrepareLoad(ctx, load, ks)
			if err != nil {
				t.Fatal(err)
			}
			for i, s := range slots {
				got, _ := a.Slot(s)
				if !bytes.Equal(got, block(ks[i])) {
					t.Fatalf("promoted slot %d of %s holds the wrong bytes", s, ks[i])
				}
			}
			if err := c.CompleteLoad(ctx, load, ks); err != nil {
				t.Fatal(err)
			}
			if err := c.FinishRequest(ctx, load); err != nil {
				t.Fatal(err)
			}
			st, err := c.Stats(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(st.GetTiers()) != 2 || st.GetTiers()[1].GetPromotionsOk() == 0 || st.GetTiers()[0].GetSkippedByFilter() == 0 {
				t.Fatalf("stats: %v", st)
			}
		})
	}
}

// TestPutGetBlocks stores and loads by value, with the promotion driven by
// GetBlocks' wait and a filter choosing the tier.
// Over TCP the calls take the daemon's block stream unless told not to;
// the answers are the same on every path.
func TestPutGetBlocks(t *testing.T) {
	for _, path := range byValuePaths {
		t.Run(path, func(t *testing.T) {
			e := startEnv(t, envOptions{stream: true})
			testPutGetBlocks(t, e.dialVia(t, path))
			const gets = `kvtier_stream_requests_total{kind="get_blocks",result="ok"}`
			m := scrape(t, e)
			if path == "tcp-stream" {
				m = scrapeUntil(t, e, func(m string) bool { return strings.Contains(m, gets) })
			}
			onStream := strings.Contains(m, gets)
			if onStream != (path == "tcp-stream") {
				t.Errorf("%s: by-value gets on the block stream: %v", path, onStream)
			}
		})
	}
}

// byValuePaths are the ways a client makes by-value calls: the API over
// the Unix socket and over TCP, and the block stream.
var byValuePaths = []string{"unix", "tcp-api", "tcp-stream"}

// dialVia dials e's daemon for one of byValuePaths.
func (e *env) dialVia(t testing.TB, path string) *client.Client {
	t.Helper()
	target, noStream := e.tcp, path == "tcp-api"
	if path == "unix" {
		target = e.unix
	}
	c, err := client.Dial(target, client.Options{Token: e.token, NoStream: noStream})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func testPutGetBlocks(t *testing.T, c *client.Client) {
	ctx := ctxT(t)
	ks := keys(100, 4)
	var blocks []client.Block
	for _, k := range ks {
		blocks = append(blocks, client.Block{Key: k, Data: block(k)})
	}
	// Cascade only to local storage.
	stored, err := c.PutBlocks(ctx, blocks, client.CallOptions{Params: `{"kv_store_tiers": [{"medium": "storage"}]}`})
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range stored {
		if !s {
			t.Fatalf("block %d not stored", i)
		}
	}
	again, err := c.PutBlocks(ctx, blocks[:1], client.CallOptions{})
	if err != nil || again[0] {
		t.Fatalf("second put: %v %v", again, err)
	}
	got, err := c.GetBlocks(ctx, ks, client.GetOptions{})
	if err != nil || got.Hits != len(ks) {
		t.Fatalf("get from primary: %+v %v", got.Results, err)
	}
	for i := range ks {
		if !bytes.Equal(got.Data[i], block(ks[i])) {
			t.Fatalf("block %d differs", i)
		}
	}
	// Wait for the cascades, then empty the primary.
	for pending := true; pending; time.Sleep(time.Millisecond) {
		if pending, err = c.ScheduleEnd(ctx, nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Reset(ctx); err != nil {
		t.Fatal(err)
	}
	// Remote CPU only: the blocks went to local storage only → miss.
	got, err = c.GetBlocks(ctx, ks, client.GetOptions{CallOptions: client.CallOptions{Params: `{"kv_load_tiers": [{"medium": "cpu", "locality": "remote"}]}`}, Wait: time.Second})
	if err != nil || got.Hits != 0 || got.Results[0] != kvtierv1.LookupResult_LOOKUP_RESULT_MISS {
		t.Fatalf("get with remote-cpu filter: %v %v", got.Results, err)
	}
	got, err = c.GetBlocks(ctx, ks, client.GetOptions{CallOptions: client.CallOptions{Params: `{"kv_load_tiers": [{"medium": "storage"}]}`}, Wait: 5 * time.Second})
	if err != nil || got.Hits != len(ks) {
		t.Fatalf("get with storage filter: %v %v", got.Results, err)
	}
	for i := range ks {
		if !bytes.Equal(got.Data[i], block(ks[i])) {
			t.Fatalf("promoted block %d differs", i)
		}
	}
}

// TestAuth checks the token on both listeners: with tokens configured a
// token-less call on the Unix socket is refused (a tenant handed the
// socket must not become the admin by dropping its token) unless
// UnixPeers names its uid.
func TestAuth(t *testing.T) {
	me := os.Getuid()
	acme := server.TenantConfig{Name: "acme", Token: "acme-token-0123456789", Namespaces: []string{""}}
	e := startEnv(t, envOptions{token: "tok", tenants: []server.TenantConfig{acme}})
	mapped := startEnv(t, envOptions{token: "tok", unixPeers: map[int]string{me: "admin"}})
	asTenant := startEnv(t, envOptions{token: "tok", tenants: []server.TenantConfig{acme}, unixPeers: map[int]string{me: "acme"}})
	other := startEnv(t, envOptions{token: "tok", unixPeers: map[int]string{me + 1: "admin"}})
	open := startEnv(t, envOptions{})
	ctx := ctxT(t)
	for _, tc := range []struct {
		name, target, token string
		code                codes.Code // of Stats (any principal)
		admin               codes.Code // of ListBlocks (the admin's)
	}{
		{"tcp without token", e.tcp, "", codes.Unauthenticated, codes.Unauthenticated},
		{"tcp wrong token", e.tcp, "nope", codes.Unauthenticated, codes.Unauthenticated},
		{"tcp right token", e.tcp, "tok", codes.OK, codes.OK},
		{"tcp tenant token", e.tcp, acme.Token, codes.OK, codes.PermissionDenied},
		{"unix without token", e.unix, "", codes.Unauthenticated, codes.Unauthenticated},
		{"unix wrong token", e.unix, "nope", codes.Unauthenticated, codes.Unauthenticated},
		{"unix admin token", e.unix, "tok", codes.OK, codes.OK},
		{"unix tenant token", e.unix, acme.Token, codes.OK, codes.PermissionDenied},
		{"unix uid mapped to admin", mapped.unix, "", codes.OK, codes.OK},
		{"unix uid mapped to a tenant", asTenant.unix, "", codes.OK, codes.PermissionDenied},
		{"unix mapped uid with a wrong token", mapped.unix, "nope", codes.Unauthenticated, codes.Unauthenticated},
		{"unix another uid mapped", other.unix, "", codes.Unauthenticated, codes.Unauthenticated},
		{"unix without any token configured", open.unix, "", codes.OK, codes.OK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := client.Dial(tc.target, client.Options{Token: tc.token})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if _, err = c.Stats(ctx); status.Code(err) != tc.code {
				t.Fatalf("Stats: got %v, want %v", err, tc.code)
			}
			if _, err = c.ListBlocks(ctx, 0, 1); status.Code(err) != tc.admin {
				t.Fatalf("ListBlocks: got %v, want %v", err, tc.admin)
			}
		})
	}
	fi, err := os.Stat(e.unix)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 || fi.Mode().Type() != os.ModeSocket {
		t.Fatalf("socket mode %v, want 0600 socket", fi.Mode())
	}
	fi, err = os.Stat(e.unix + ".arena")
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("arena socket: %v %v", fi, err)
	}
}

// TestMetrics scrapes /metrics after some traffic.
func TestMetrics(t *testing.T) {
	e := startEnv(t, envOptions{})
	ctx := ctxT(t)
	c := e.dial(t, e.unix)
	if _, err := c.NewRequest(ctx, "m", `{"kv_load_tiers": "storage"}`); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Lookup(ctx, "m", keys(0, 3), false); err != nil {
		t.Fatal(err)
	}
	// Two blocks cascade to both memory tiers: store latencies and
	// occupancy.
	var blocks []client.Block
	for _, k := range keys(50, 2) {
		blocks = append(blocks, client.Block{Key: k, Data: block(k)})
	}
	if _, err := c.PutBlocks(ctx, blocks, client.CallOptions{}); err != nil {
		t.Fatal(err)
	}
	for pending := true; pending; time.Sleep(time.Millisecond) {
		var err error
		if pending, err = c.ScheduleEnd(ctx, nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	body := scrape(t, e)
	for _, want := range []string{
		`kvtier_filter_warnings_total{reason="not_list"} 1`,
		`kvtier_tier_lookups_total{locality="REMOTE",medium="CPU",namespace="",result="miss",tier="remote-cpu",type="memory"} 3`,
		`kvtier_primary_slots{namespace="",state="total"} 64`,
		`kvtier_api_calls_total{code="OK",method="Lookup"} 1`,
		`kvtier_tier_cascades_total`,
		`kvtier_events_published_total`,
		`kvtier_tier_job_duration_seconds_bucket{kind="store",locality="LOCAL",medium="STORAGE",namespace="",tier="local-disk",type="memory",le="0.0001"}`,
		`kvtier_tier_blocks{locality="LOCAL",medium="STORAGE",namespace="",tier="local-disk",type="memory"} 2`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

// TestStaleSocket replaces a socket nobody serves on and refuses to take
// over a live one or a regular file.
func TestStaleSocket(t *testing.T) {
	e := startEnv(t, envOptions{})
	mk := func(path string) error {
		p, err := cpu.New(cpu.Config{SlotSize: slotSize, Capacity: slotSize * 4})
		if err != nil {
			t.Fatal(err)
		}
		m, err := tiering.New(tiering.Config{Primary: p, Logger: quietLogger()})
		if err != nil {
			t.Fatal(err)
		}
		srv, err := server.New(server.Config{Namespaces: []server.NamespaceConfig{server.ManagerNamespace("", m, p, offload.Parser{})}, UnixSocket: path, Logger: quietLogger()})
		if err != nil {
			t.Fatal(err)
		}
		err = srv.Start()
		srv.Shutdown(context.Background())
		return err
	}
	if err := mk(e.unix); err == nil || !strings.Contains(err.Error(), "another process") {
		t.Fatalf("live socket: %v", err)
	}
	stale := filepath.Join(e.dir, "stale.sock")
	ln, err := net.Listen("unix", stale)
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close()
	if err := mk(stale); err != nil {
		t.Fatalf("stale socket: %v", err)
	}
	regular := filepath.Join(e.dir, "file")
	os.WriteFile(regular, nil, 0o600)
	if err := mk(regular); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Fatalf("regular file: %v", err)
	}
}

// TestConcurrentClients runs many engines at once (run with -race).
func TestConcurrentClients(t *testing.T) {
	e := startEnv(t, envOptions{slots: 256})
	ctx := ctxT(t)
	const clients, rounds = 8, 20
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for w := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			target := e.unix
			if w%2 == 1 {
				target = e.tcp
			}
			c, err := client.Dial(target, client.Options{})
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			for r := range rounds {
				id := fmt.Sprintf("w%d-r%d", w, r)
				ks := keys(w*1000+r*4, 4)
				if _, err := c.NewRequest(ctx, id, `{"kv_store_tiers": [{"medium": "storage"}]}`); err != nil {
					errs <- err
					return
				}
				var blocks []client.Block
				for _, k := range ks {
					blocks = append(blocks, client.Block{Key: k, Data: block(k)})
				}
				if _, err := c.PutBlocks(ctx, blocks, client.CallOptions{RequestID: id}); err != nil {
					errs <- fmt.Errorf("%s put: %w", id, err)
					return
				}
				got, err := c.GetBlocks(ctx, ks, client.GetOptions{CallOptions: client.CallOptions{RequestID: id}, Wait: time.Second})
				if err != nil {
					errs <- fmt.Errorf("%s get: %w", id, err)
					return
				}
				for i, d := range got.Data {
					if d != nil && !bytes.Equal(d, block(ks[i])) {
						errs <- fmt.Errorf("%s: block %d has wrong bytes", id, i)
						return
					}
				}
				if err := c.FinishRequest(ctx, id); err != nil {
					errs <- err
					return
				}
				if _, err := c.ScheduleEnd(ctx, []string{id}, nil); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestArenaKinds maps a shared-file arena (by path and by descriptor) and
// refuses an anonymous one.
func TestArenaKinds(t *testing.T) {
	path := filepath.Join(shortTempDir(t), "arena")
	e := startEnv(t, envOptions{arena: cpu.ArenaConfig{Kind: cpu.ArenaFile, Path: path}})
	ctx := ctxT(t)
	c := e.dial(t, e.tcp)
	info, err := c.API().GetArena(ctx, &kvtierv1.GetArenaRequest{})
	if err != nil || info.GetKind() != kvtierv1.ArenaKind_ARENA_KIND_FILE || info.GetPath() != path || info.GetSize() != 64*slotSize {
		t.Fatalf("GetArena: %v %v", info, err)
	}
	a, err := c.MapArena(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if _, err := c.NewRequest(ctx, "f", ""); err != nil {
		t.Fatal(err)
	}
	storeViaArena(t, ctx, c, a, "f", keys(0, 2))
	got, err := c.GetBlocks(ctx, keys(0, 2), client.GetOptions{})
	if err != nil || got.Hits != 2 || !bytes.Equal(got.Data[1], block(key(1))) {
		t.Fatalf("blocks written through the file mapping: %v %v", got.Results, err)
	}
	if _, err := a.Slot(64); err == nil {
		t.Fatal("slot past the end")
	}

	anon := startEnv(t, envOptions{arena: cpu.ArenaConfig{Kind: cpu.ArenaAnonymous}})
	if _, err := anon.dial(t, anon.unix).MapArena(ctx); !errors.Is(err, client.ErrArenaNotShared) {
		t.Fatalf("anonymous arena: %v", err)
	}
	if _, err := client.ReceiveArenaFD(ctx, anon.unix+".arena", "", ""); err == nil || !strings.Contains(err.Error(), "anonymous arena") {
		t.Fatalf("side channel, anonymous arena: %v", err)
	}
}

// TestShutdownDrains stops the daemon while cascades are in flight: they
// finish before the tiers close, and the socket goes away.
func TestShutdownDrains(t *testing.T) {
	var slow *recorder
	sink := &eventLog{}
	e := startEnv(t, envOptions{events: sink, tiers: func(t envT) []offload.SecondaryTier {
		m, err := memory.New(memory.Config{Name: "slow", Medium: offload.MediumStorage, Locality: offload.LocalityLocal, Latency: 100 * time.Millisecond, Events: true})
		if err != nil {
			t.Fatal(err)
		}
		slow = &recorder{SecondaryTier: m}
		return []offload.SecondaryTier{slow}
	}})
	ctx := ctxT(t)
	c := e.dial(t, e.unix)
	ks := keys(0, 3)
	var blocks []client.Block
	for _, k := range ks {
		blocks = append(blocks, client.Block{Key: k, Data: block(k)})
	}
	if _, err := c.PutBlocks(ctx, blocks, client.CallOptions{}); err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.srv.Shutdown(sctx); err != nil {
		t.Fatal(err)
	}
	if slow.ok.Load() == 0 || slow.failed.Load() != 0 {
		t.Fatalf("cascades at shutdown: %d ok, %d failed", slow.ok.Load(), slow.failed.Load())
	}
	// The tier's stored events were published before it closed.
	stored := 0
	for _, ev := range sink.all() {
		if ev.Tier == "slow" && !ev.Removed {
			stored += len(ev.Keys)
		}
	}
	if stored != len(ks) {
		t.Fatalf("%d of %d stored events of the slow tier published at shutdown", stored, len(ks))
	}
	if _, err := os.Stat(e.unix); !os.IsNotExist(err) {
		t.Fatalf("socket left behind: %v", err)
	}
	if _, err := c.Stats(ctx); status.Code(err) != codes.Unavailable {
		t.Fatalf("call after shutdown: %v", err)
	}
}

// recorder counts the job results a tier reports.
type recorder struct {
	offload.SecondaryTier
	ok, failed atomic.Int64
}

func (r *recorder) FinishedJobs() []offload.JobResult {
	rs := r.SecondaryTier.FinishedJobs()
	for _, res := range rs {
		if res.Success {
			r.ok.Add(1)
		} else {
			r.failed.Add(1)
		}
	}
	return rs
}

// eventLog is an EventSink that keeps everything.
type eventLog struct {
	mu  sync.Mutex
	evs []offload.Event
}

func (l *eventLog) Publish(evs []offload.Event) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.evs = append(l.evs, evs...)
	return nil
}

func (l *eventLog) all() []offload.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]offload.Event(nil), l.evs...)
}

// TestTemporaryRequestIDs keeps the ids of by-value calls apart from
// clients' ids.
func TestTemporaryRequestIDs(t *testing.T) {
	e := startEnv(t, envOptions{})
	ctx := ctxT(t)
	c := e.dial(t, e.unix)
	if _, err := c.NewRequest(ctx, "kvtier-internal-1", `{"kv_load_tiers": []}`); err != nil {
		t.Fatal(err)
	}
	if _, err := c.PutBlocks(ctx, []client.Block{{Key: key(1), Data: block(key(1))}}, client.CallOptions{}); err != nil {
		t.Fatal(err)
	}
	res, hits, err := c.Lookup(ctx, "kvtier-internal-1", []offload.Key{key(1)}, false)
	if err != nil || hits != 1 {
		t.Fatalf("client request after a by-value call: %v %v", res, err)
	}
	if err := c.FinishRequest(ctx, "kvtier-internal-1"); err != nil {
		t.Fatal(err)
	}
	st, err := c.Stats(ctx)
	if err != nil || st.GetActiveRequests() != 0 {
		t.Fatalf("requests left behind: %v %v", st.GetActiveRequests(), err)
	}
}
