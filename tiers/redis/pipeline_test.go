package redis

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/alicebob/miniredis/v2"
	goredis "github.com/redis/go-redis/v9"

	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/tiers/redis/slotpipe"
	rt "github.com/kvtier/kvtier/tiers/remote/remotetest"
)

// roundTrips records what the client sends: one entry per round trip,
// the names of its commands joined by spaces.
type roundTrips struct {
	mu   sync.Mutex
	sent []string
}

func (r *roundTrips) add(cmds ...goredis.Cmder) {
	names := make([]string, len(cmds))
	for i, c := range cmds {
		names[i] = c.Name()
	}
	if len(names) == 1 && names[0] == "hello" {
		return // a new connection's handshake
	}
	r.mu.Lock()
	r.sent = append(r.sent, strings.Join(names, " "))
	r.mu.Unlock()
}

func (r *roundTrips) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.sent
	r.sent = nil
	return out
}

func (r *roundTrips) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (r *roundTrips) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		r.add(cmd)
		return next(ctx, cmd)
	}
}

func (r *roundTrips) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		r.add(cmds...)
		return next(ctx, cmds)
	}
}

// TestPipelined: a step's existence checks are one round trip through
// the client; a store job and a load job of several blocks go on the
// tier's own connection (one, reused), the load's GETs in one write.
func TestPipelined(t *testing.T) {
	m := miniredis.RunT(t)
	tier := newTier(t, testConfig(m.Addr()))
	rec := &roundTrips{}
	tier.client.AddHook(rec)
	var dials, getWrites atomic.Int32
	tier.pipes = slotpipe.New(slotpipe.Options{Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		var d net.Dialer
		nc, err := d.DialContext(ctx, network, addr)
		return &countGets{Conn: nc, n: &getWrites}, err
	}})
	keys := rt.Keys(0, 4)
	arena := rt.NewArena(1024, 4)

	req, _ := offload.NewReqContext("r", nil)
	for _, k := range keys {
		tier.Lookup(k, req)
	}
	tier.OnScheduleEnd(offload.ScheduleEnd{})
	for _, k := range keys {
		if r := rt.Resolve(t, tier, k, req); r != offload.Miss {
			t.Fatalf("lookup %v", r)
		}
	}
	if got := rec.take(); len(got) != 1 || got[0] != "exists exists exists exists" {
		t.Fatalf("existence checks sent as %q, want one pipeline of 4 EXISTS", got)
	}
	if res := rt.Run(t, tier, rt.StoreJob(1, arena, keys, rt.Slots(0, 4))); !res.Success {
		t.Fatal(res)
	}
	if res := rt.Run(t, tier, rt.LoadJob(2, arena, keys, rt.Slots(0, 4), req)); !res.Success {
		t.Fatal(res)
	}
	if got := rec.take(); len(got) != 0 {
		t.Fatalf("the jobs sent %q through the client, want them on the tier's own connection", got)
	}
	if dials.Load() != 1 || getWrites.Load() != 1 {
		t.Fatalf("%d connections, %d writes of GETs; want 1 and 1", dials.Load(), getWrites.Load())
	}
}

// countGets counts the writes that carry a GET.
type countGets struct {
	net.Conn
	n *atomic.Int32
}

func (c *countGets) Write(p []byte) (int, error) {
	if bytes.Contains(p, []byte("\r\nGET\r\n")) {
		c.n.Add(1)
	}
	return c.Conn.Write(p)
}

// When the tier's own connection fails, a store and a load go through
// the client in one pipeline each, the failed attempt counted as a retry;
// when the server answers it with an error (here MOVED), they go through
// the client without one.
func TestTransfersFallBackToTheClient(t *testing.T) {
	m := miniredis.RunT(t)
	tier := newTier(t, testConfig(m.Addr()))
	rec := &roundTrips{}
	tier.client.AddHook(rec)
	keys := rt.Keys(0, 4)
	arena := rt.NewArena(1024, 4)
	for i := range 4 {
		arena.Fill(int64(i), uint64(i))
	}
	req, _ := offload.NewReqContext("r", nil)
	// run runs a job and checks what went through the client and the
	// counters after it.
	run := func(job *offload.Job, sent string, retries, stored, loaded int64) {
		t.Helper()
		if res := rt.Run(t, tier, job); !res.Success {
			t.Fatal(res)
		}
		if got := rec.take(); len(got) != 1 || got[0] != sent {
			t.Fatalf("job %d sent through the client as %q, want one pipeline %q", job.ID, got, sent)
		}
		st := tier.Stats()
		if st.Retries != retries || st.BlocksStored != stored || st.BlocksLoaded != loaded {
			t.Fatalf("job %d: retries %d, blocks stored %d, loaded %d; want %d, %d, %d", job.ID, st.Retries, st.BlocksStored, st.BlocksLoaded, retries, stored, loaded)
		}
	}
	tier.pipes = slotpipe.New(slotpipe.Options{Dial: func(context.Context, string, string) (net.Conn, error) {
		return nil, errors.New("dial refused by the test")
	}})
	run(rt.StoreJob(1, arena, keys, rt.Slots(0, 4)), "set set set set", 1, 4, 0)
	dst := rt.NewArena(1024, 4)
	run(rt.LoadJob(2, dst, keys, rt.Slots(0, 4), req), "get get get get", 2, 4, 4)
	for i := range int64(4) {
		a, _ := arena.Slot(i)
		b, _ := dst.Slot(i)
		if !bytes.Equal(a, b) {
			t.Fatalf("block %d read back other bytes", i)
		}
	}

	// A server that answers every command with MOVED to the real one.
	moved := serveCommands(t, func(args []string) string { return "-MOVED 1 " + m.Addr() + "\r\n" })
	tier.pipes = slotpipe.New(slotpipe.Options{Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, moved)
	}})
	one := rt.Keys(10, 1)
	run(rt.StoreJob(3, arena, one, rt.Slots(0, 1)), "set", 2, 5, 4)
	run(rt.LoadJob(4, dst, one, rt.Slots(3, 1), req), "get", 2, 5, 5)
}

// serveCommands serves RESP commands on loopback, answering each with
// reply(its arguments).
func serveCommands(t *testing.T, reply func(args []string) string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer nc.Close()
				r := bufio.NewReader(nc)
				for {
					var n int
					if _, err := fmt.Fscanf(r, "*%d\r\n", &n); err != nil {
						return
					}
					args := make([]string, n)
					for i := range args {
						var l int
						if _, err := fmt.Fscanf(r, "$%d\r\n", &l); err != nil {
							return
						}
						b := make([]byte, l+2)
						if _, err := io.ReadFull(r, b); err != nil {
							return
						}
						args[i] = string(b[:l])
					}
					if _, err := io.WriteString(nc, reply(args)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}
