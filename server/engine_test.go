package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	kvtierv1 "github.com/kvtier/kvtier/api/kvtier/v1"
	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/cpu"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/region"
	"github.com/kvtier/kvtier/server"
	"github.com/kvtier/kvtier/tiering"
)

// A daemon whose engines attach in manager mode, each layout getting a
// 16-slot primary.
func startEngineDaemon(t *testing.T) (string, *server.Server) {
	return startEngineDaemonWith(t, server.Limits{}, nil)
}

// startEngineDaemonWith is startEngineDaemon with limits and, when tiers
// is not nil, the secondary tiers it makes for each namespace.
func startEngineDaemonWith(t testing.TB, limits server.Limits, tiers func() ([]offload.SecondaryTier, error), mods ...func(*server.Config)) (string, *server.Server) {
	t.Helper()
	dir := shortTempDir(t)
	sock := filepath.Join(dir, "k.sock")
	cfg := server.Config{
		UnixSocket: sock,
		Limits:     limits,
		Engines: func(_ context.Context, name string, l region.Layout) (server.NamespaceConfig, error) {
			p, err := cpu.New(cpu.Config{SlotSize: l.RowStride, Capacity: int64(16 * l.RowStride), Arena: cpu.ArenaConfig{Kind: cpu.ArenaMemfd}, Events: true})
			if err != nil {
				return server.NamespaceConfig{}, err
			}
			var ts []offload.SecondaryTier
			if tiers != nil {
				if ts, err = tiers(); err != nil {
					return server.NamespaceConfig{}, err
				}
			}
			m, err := tiering.New(tiering.Config{Primary: p, Tiers: ts})
			if err != nil {
				return server.NamespaceConfig{}, err
			}
			return server.ManagerNamespace(name, m, p, offload.Parser{}), nil
		},
	}
	for _, mod := range mods {
		mod(&cfg)
	}
	srv, err := server.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Shutdown(context.Background()) })
	return sock, srv
}

// dialEngine connects to sock as one engine (one session), closed with
// the test.
func dialEngine(t *testing.T, sock string) *client.Client {
	t.Helper()
	c, err := client.Dial(sock, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func engineLayout() string {
	b, _ := json.Marshal(map[string]any{"row_stride": 4096, "blocks_per_chunk": 1, "model": "m", "dtype": "float16", "world_size": 1})
	return string(b)
}

func pack(keys ...offload.Key) ([]byte, uint32) {
	var b []byte
	for _, k := range keys {
		b = append(b, k...)
	}
	return b, uint32(len(keys[0]))
}

func TestEngineAttachLeaseStoreLookup(t *testing.T) {
	sock, _ := startEngineDaemon(t)
	ctx := ctxT(t)
	dial := func() *client.Client {
		c, err := client.Dial(sock, client.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	e1, e2 := dial(), dial()
	att, err := e1.API().EngineAttach(ctx, &kvtierv1.EngineAttachRequest{Layout: engineLayout()})
	if err != nil || att.GetSlotSize() != 4096 || att.GetNumSlots() != 16 {
		t.Fatalf("attach: %v %v", att, err)
	}
	att2, err := e2.API().EngineAttach(ctx, &kvtierv1.EngineAttachRequest{Layout: engineLayout()})
	if err != nil || att2.GetNamespace() != att.GetNamespace() {
		t.Fatalf("second engine of the layout: %v %v", att2, err)
	}
	ns := att.GetNamespace()
	arena, err := e1.WithNamespace(ns).MapArena(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer arena.Close()

	// Step 1: a request, and four slots leased.
	r1, err := e1.API().EngineStep(ctx, &kvtierv1.EngineStepRequest{Namespace: ns,
		NewRequests: []*kvtierv1.EngineNewRequest{{RequestId: "a"}}, WantFreeSlots: 4})
	if err != nil || len(r1.GetGrantedSlots()) != 4 || len(r1.GetWarnings()) != 0 {
		t.Fatalf("step 1: %v %v", r1, err)
	}
	slots := r1.GetGrantedSlots()
	k1, k2 := offload.MakeKey([]byte("engine-block-1"), 0), offload.MakeKey([]byte("engine-block-2"), 0)
	for i, s := range slots[:2] {
		b, _ := arena.Slot(s)
		copy(b, strings.Repeat(string(rune('a'+i)), 4096))
	}
	// Step 2: the engine stored two blocks locally; it commits them, and a
	// slot it does not hold is refused with a warning.
	packed, size := pack(k1, k2)
	r2, err := e1.API().EngineStep(ctx, &kvtierv1.EngineStepRequest{Namespace: ns,
		Stores: []*kvtierv1.EngineStore{
			{RequestId: "a", PackedKeys: packed, KeySize: size, Slots: slots[:2], Success: true},
			{RequestId: "a", PackedKeys: packed[:size], KeySize: size, Slots: []int64{15}, Success: true},
		},
		FinishedRequestIds: []string{"a"}, WantFreeSlots: 2})
	if err != nil || len(r2.GetWarnings()) != 1 || !strings.Contains(r2.GetWarnings()[0], "not leased to this engine") {
		t.Fatalf("step 2: %v %v", r2, err)
	}
	if len(r2.GetEvents()) != 2 || r2.GetEvents()[0].GetRemoved() || r2.GetEvents()[1].GetRemoved() {
		t.Fatalf("step 2 events %v, want the stored blocks", r2.GetEvents())
	}
	// Engine 2 looks them up: a HIT pins the block for it and names its slot.
	packed2, size2 := pack(k1, offload.MakeKey([]byte("engine-block-9"), 0))
	r3, err := e2.API().EngineStep(ctx, &kvtierv1.EngineStepRequest{Namespace: ns,
		NewRequests: []*kvtierv1.EngineNewRequest{{RequestId: "a"}}, // the same id: per engine
		Lookups:     []*kvtierv1.EngineKeys{{RequestId: "a", PackedKeys: packed2, KeySize: size2}}})
	if err != nil || len(r3.GetLookups()) != 1 {
		t.Fatalf("step 3: %v %v", r3, err)
	}
	lk := r3.GetLookups()[0]
	if lk.GetFound()[0] != byte(kvtierv1.RegionFound_REGION_FOUND_HIT) || lk.GetFound()[1] != byte(kvtierv1.RegionFound_REGION_FOUND_MISS) || len(lk.GetSlots()) != 1 || lk.GetSlots()[0] != slots[0] {
		t.Fatalf("lookup answer %v (slots %v)", lk, slots)
	}
	st, err := e2.WithNamespace(ns).Stats(ctx)
	if err != nil || st.GetPrimary().GetPinnedSlots() != 1 {
		t.Fatalf("the lookup lease does not pin: %v %v", st.GetPrimary(), err)
	}
	// A reserve says which keys the daemon holds, leases slots for the
	// others only, and pins nothing.
	packed3, size3 := pack(k2, offload.MakeKey([]byte("engine-block-9"), 0))
	r4, err := e2.API().EngineReserve(ctx, &kvtierv1.EngineReserveRequest{Namespace: ns, PackedKeys: packed3, KeySize: size3, MoreSlots: 3})
	if err != nil || len(r4.GetGrantedSlots()) != 1 || !bytes.Equal(r4.GetFound(),
		[]byte{byte(kvtierv1.RegionFound_REGION_FOUND_HIT), byte(kvtierv1.RegionFound_REGION_FOUND_MISS)}) {
		t.Fatalf("reserve: %v %v", r4, err)
	}
	if st, err := e2.WithNamespace(ns).Stats(ctx); err != nil || st.GetPrimary().GetPinnedSlots() != 1 || st.GetPrimary().GetLeasedSlots() < 1 {
		t.Fatalf("after a reserve: %v %v (want 1 pin, its slot leased)", st.GetPrimary(), err)
	}
	// Engine 1 dies: its leased slots come back; engine 2's lease stays.
	e1.Close()
	for i := 0; ; i++ {
		st, err := e2.WithNamespace(ns).Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		p := st.GetPrimary()
		if p.GetLeasedSlots() == 1 && p.GetPinnedSlots() == 1 && p.GetUsedSlots() == 2 {
			break
		}
		if i > 2000 {
			t.Fatalf("after engine 1 ended: %v (want its 4 leased slots back, engine 2's pin and leases kept)", p)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A restarted daemon's namespace of the same layout is another epoch: a
// step that names the old one is refused whole, so no slot or pin of the
// old arena is taken for one of the new.
func TestEngineStepOfAnotherEpochIsRefused(t *testing.T) {
	ctx := ctxT(t)
	attach := func(sock string) (*client.Client, *kvtierv1.EngineAttachResponse) {
		c := dialEngine(t, sock)
		att, err := c.API().EngineAttach(ctx, &kvtierv1.EngineAttachRequest{Layout: engineLayout()})
		if err != nil {
			t.Fatal(err)
		}
		return c, att
	}
	sock1, _ := startEngineDaemon(t)
	c1, a1 := attach(sock1)
	_, a1b := attach(sock1)
	if a1.GetEpoch() == 0 || a1b.GetEpoch() != a1.GetEpoch() {
		t.Fatalf("epochs of one namespace: %x and %x, want one nonzero epoch", a1.GetEpoch(), a1b.GetEpoch())
	}
	sock2, _ := startEngineDaemon(t) // the daemon, restarted
	c2, a2 := attach(sock2)
	if a2.GetNamespace() != a1.GetNamespace() || a2.GetEpoch() == a1.GetEpoch() || a2.GetEpoch() == 0 {
		t.Fatalf("restarted namespace %q epoch %x; the first %q epoch %x", a2.GetNamespace(), a2.GetEpoch(), a1.GetNamespace(), a1.GetEpoch())
	}
	step := func(c *client.Client, epoch uint64) error {
		_, err := c.API().EngineStep(ctx, &kvtierv1.EngineStepRequest{Namespace: a2.GetNamespace(), Epoch: epoch,
			NewRequests: []*kvtierv1.EngineNewRequest{{RequestId: "r"}}, WantFreeSlots: 1})
		return err
	}
	err := step(c2, a1.GetEpoch())
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "attach again") {
		t.Fatalf("a step of the old epoch: %v, want FAILED_PRECONDITION naming the remedy", err)
	}
	st, err := c2.WithNamespace(a2.GetNamespace()).Stats(ctx)
	if err != nil || st.GetActiveRequests() != 0 || st.GetPrimary().GetPinnedSlots() != 0 {
		t.Fatalf("the refused step left state: %v %v", st, err)
	}
	if err := step(c2, a2.GetEpoch()); err != nil {
		t.Fatalf("a step of the current epoch: %v", err)
	}
	if err := step(c2, 0); err != nil {
		t.Fatalf("a step without an epoch (no check): %v", err)
	}
	if err := step(c1, a1.GetEpoch()); err != nil {
		t.Fatalf("the first daemon, still up, answers its own epoch: %v", err)
	}
}

// engineWithRequest attaches an engine to a new daemon and makes its
// first step: request "a" and one leased slot.
func engineWithRequest(t *testing.T) (*client.Client, *kvtierv1.EngineAttachResponse, *kvtierv1.EngineStepResponse) {
	t.Helper()
	sock, _ := startEngineDaemon(t)
	ctx := ctxT(t)
	c := dialEngine(t, sock)
	att, err := c.API().EngineAttach(ctx, &kvtierv1.EngineAttachRequest{Layout: engineLayout()})
	if err != nil {
		t.Fatal(err)
	}
	r1, err := c.API().EngineStep(ctx, &kvtierv1.EngineStepRequest{Namespace: att.GetNamespace(), Epoch: att.GetEpoch(),
		NewRequests: []*kvtierv1.EngineNewRequest{{RequestId: "a"}}, WantFreeSlots: 1})
	if err != nil || len(r1.GetGrantedSlots()) != 1 {
		t.Fatalf("step 1: %v %v", r1, err)
	}
	return c, att, r1
}

// vLLM resets its cache between steps, so a reset and the next step's
// lookups travel in one EngineStep: the reset comes first, and a block it
// drops is neither answered HIT nor left leased to the lookup.
func TestEngineResetComesBeforeTheStepsLookups(t *testing.T) {
	ctx := ctxT(t)
	c, att, r1 := engineWithRequest(t)
	ns := att.GetNamespace()
	k := offload.MakeKey([]byte("reset-block"), 0)
	packed, size := pack(k)
	if _, err := c.API().EngineStep(ctx, &kvtierv1.EngineStepRequest{Namespace: ns, Epoch: att.GetEpoch(),
		Stores:      []*kvtierv1.EngineStore{{RequestId: "a", PackedKeys: packed, KeySize: size, Slots: r1.GetGrantedSlots(), Success: true}},
		NewRequests: []*kvtierv1.EngineNewRequest{{RequestId: "b"}}}); err != nil {
		t.Fatal(err)
	}
	r3, err := c.API().EngineStep(ctx, &kvtierv1.EngineStepRequest{Namespace: ns, Epoch: att.GetEpoch(), ResetCache: true,
		Lookups: []*kvtierv1.EngineKeys{{RequestId: "b", PackedKeys: packed, KeySize: size}}})
	if err != nil || len(r3.GetLookups()) != 1 {
		t.Fatalf("reset step: %v %v", r3, err)
	}
	if f := r3.GetLookups()[0].GetFound()[0]; f != byte(kvtierv1.RegionFound_REGION_FOUND_MISS) {
		t.Fatalf("a lookup after the reset in its step answered %d, want MISS", f)
	}
	st, err := c.WithNamespace(ns).Stats(ctx)
	if err != nil || st.GetPrimary().GetPinnedSlots() != 0 || st.GetPrimary().GetUsedSlots() != 0 {
		t.Fatalf("after the reset: %v %v, want no block and no pin", st.GetPrimary(), err)
	}
}

// A daemon without a namespace of its own (primary.bytes: 0) says so
// when asked for its default namespace, and once one engine layout has
// attached answers for it.
func TestStatsWithoutANamespaceOfItsOwn(t *testing.T) {
	sock, _ := startEngineDaemon(t)
	ctx := ctxT(t)
	c := dialEngine(t, sock)
	if _, err := c.Stats(ctx); status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), "no namespace yet") {
		t.Fatalf("stats of a daemon with no namespace: %v", err)
	}
	att, err := c.API().EngineAttach(ctx, &kvtierv1.EngineAttachRequest{Layout: engineLayout()})
	if err != nil {
		t.Fatal(err)
	}
	st, err := c.Stats(ctx)
	if err != nil || st.GetNamespace() != att.GetNamespace() || st.GetPrimary().GetNumSlots() != 16 {
		t.Fatalf("stats with one engine namespace: %v %v", st, err)
	}
}

// A step call with keep_events (an engine's first sight, made ahead of a
// step call in flight) leaves its events to the next call, so that they
// reach the engine in the order they happened.
func TestEngineStepKeepEvents(t *testing.T) {
	ctx := ctxT(t)
	c, att, r1 := engineWithRequest(t)
	ns := att.GetNamespace()
	packed, size := pack(offload.MakeKey([]byte("kept-event"), 0))
	r2, err := c.API().EngineStep(ctx, &kvtierv1.EngineStepRequest{Namespace: ns, Epoch: att.GetEpoch(), KeepEvents: true,
		Stores: []*kvtierv1.EngineStore{{RequestId: "a", PackedKeys: packed, KeySize: size, Slots: r1.GetGrantedSlots(), Success: true}}})
	if err != nil || len(r2.GetEvents()) != 0 {
		t.Fatalf("a step with keep_events: %v %v (want no events)", r2, err)
	}
	r3, err := c.API().EngineStep(ctx, &kvtierv1.EngineStepRequest{Namespace: ns, Epoch: att.GetEpoch()})
	if err != nil || len(r3.GetEvents()) != 1 || r3.GetEvents()[0].GetRemoved() {
		t.Fatalf("the next step: %v %v (want the stored block's event)", r3, err)
	}
}
