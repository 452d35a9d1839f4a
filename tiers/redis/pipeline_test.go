package redis

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/alicebob/miniredis/v2"
	goredis "github.com/redis/go-redis/v9"

	"github.com/kvtier/kvtier/offload"
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

// TestPipelined: a step's existence checks, a store job and a load job
// of several blocks are one round trip each.
func TestPipelined(t *testing.T) {
	m := miniredis.RunT(t)
	tier := newTier(t, testConfig(m.Addr()))
	rec := &roundTrips{}
	tier.client.AddHook(rec)
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
	if got := rec.take(); len(got) != 1 || got[0] != "set set set set" {
		t.Fatalf("store sent as %q, want one pipeline of 4 SET", got)
	}
	if res := rt.Run(t, tier, rt.LoadJob(2, arena, keys, rt.Slots(0, 4), req)); !res.Success {
		t.Fatal(res)
	}
	if got := rec.take(); len(got) != 1 || got[0] != "get get get get" {
		t.Fatalf("load sent as %q, want one pipeline of 4 GET", got)
	}
}
