package server_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/status"

	kvtierv1 "github.com/kvtier/kvtier/api/kvtier/v1"
	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/filemapper"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/server"
	"github.com/kvtier/kvtier/tiers/fs"
	"github.com/kvtier/kvtier/tiers/memory"
)

// content is the test block of key k at the env's slot size.
func content(k offload.Key) []byte {
	return bytes.Repeat([]byte(k.Hash()), slotSize/len(k.Hash())+1)[:slotSize]
}

// Finding 2: a Reset from any client freed slots other clients were still
// writing; a stale write landed in a reused slot, was cascaded to disk
// with a valid checksum and served from disk later. A reset now keeps
// what a client holds: every read, from the primary and from disk,
// returns the bytes last stored for its key.
func TestResetUnderClientsServesNoWrongBytes(t *testing.T) {
	e := startEnv(t, envOptions{slots: 64, tiers: func(envT) []offload.SecondaryTier {
		tier, err := fs.New(fs.Config{Name: "disk", RootDir: t.TempDir(), Locality: "local",
			Namespace: filemapper.Namespace{ModelName: "reset", BlockBytes: slotSize}, Logger: quietLogger()})
		if err != nil {
			t.Fatal(err)
		}
		return []offload.SecondaryTier{tier}
	}})
	ctx := ctxT(t)
	writer, other := e.dial(t, e.unix), e.dial(t, e.unix)
	arena, err := writer.MapArena(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer arena.Close()
	if _, err := writer.NewRequest(ctx, "w", ""); err != nil {
		t.Fatal(err)
	}
	mine := keys(100, 4)
	res, err := writer.PrepareStore(ctx, "w", mine, nil)
	if err != nil || !res.OK {
		t.Fatal(res, err)
	}
	// Another client resets and fills the primary while the writer has
	// not written its slots yet.
	if err := other.Reset(ctx); err != nil {
		t.Fatal(err)
	}
	theirs := keys(200, 12) // new slots come from the fresh ones, then from the freed
	var blocks []client.Block
	for _, k := range theirs {
		blocks = append(blocks, client.Block{Key: k, Data: content(k)})
	}
	if _, err := other.PutBlocks(ctx, blocks, client.CallOptions{}); err != nil {
		t.Fatal(err)
	}
	// The writer's late writes go where its reservation said.
	for i, k := range res.Keys {
		s, err := arena.Slot(res.Slots[i])
		if err != nil {
			t.Fatal(err)
		}
		copy(s, content(k))
	}
	if err := writer.CompleteStore(ctx, "w", res.Keys, true); err != nil {
		t.Fatal(err)
	}
	all := append(append([]offload.Key{}, mine...), theirs...)
	verify := func(how string, params string) {
		t.Helper()
		got, err := other.GetBlocks(ctx, all, client.GetOptions{CallOptions: client.CallOptions{Params: params}, Wait: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		for i, k := range all {
			if got.Results[i] != 2 { // HIT
				t.Fatalf("%s: %s answered %v", how, k, got.Results[i])
			}
			if !bytes.Equal(got.Data[i], content(k)) {
				t.Fatalf("%s: %s served another block's bytes", how, k)
			}
		}
	}
	verify("from the primary", "")
	// Everything reached the disk; empty the primary and read it back
	// from there.
	drain(t, other)
	if err := other.Reset(ctx); err != nil {
		t.Fatal(err)
	}
	verify("from the fs tier", `{"kv_load_tiers":[{"medium":"storage"}]}`)
}

// drain steps until no tier work is pending.
func drain(t *testing.T, c *client.Client) {
	t.Helper()
	for pending := true; pending; {
		var err error
		if pending, err = c.ScheduleEnd(ctxT(t), nil, nil); err != nil {
			t.Fatal(err)
		}
		if pending {
			time.Sleep(time.Millisecond)
		}
	}
}

// Finding 3: requests never expired, and each kept its decoded
// kv_transfer_params (1.66 MB of RSS with 64 KiB params): 65 489 requests
// never finished took the daemon to 6.9 GB. Requests now expire, their
// params are bounded per session and in all, and a request costs about
// its params' size.
func TestRequestsExpireAndTheirMemoryIsBounded(t *testing.T) {
	e := startEnv(t, envOptions{limits: server.Limits{RequestIdleTimeout: time.Second, MaxSessionParamsBytes: 256 << 10}})
	ctx := ctxT(t)
	c := e.dial(t, e.unix)
	params := `{"kv_load_tiers":[],"junk":[` + strings.Repeat(`1,`, 30000) + `1]}` // ~60 KiB, mostly numbers
	for i := range 4 {
		if _, err := c.NewRequest(ctx, fmt.Sprint("big-", i), params); err != nil {
			t.Fatal(err)
		}
	}
	_, err := c.NewRequest(ctx, "one-too-many", params)
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "this session's requests hold") {
		t.Fatalf("a fifth 60 KiB request in a 256 KiB session: %v", err)
	}
	// Nobody finishes them: they expire.
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := c.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.GetActiveRequests() == 0 && st.GetExpiredRequests() == 4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("requests never expired: %d active, %d expired", st.GetActiveRequests(), st.GetExpiredRequests())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, _, err := c.Lookup(ctx, "big-0", keys(1, 1), false); status.Code(err) != codes.NotFound {
		t.Fatalf("expired request still answers: %v", err)
	}
	if _, err := c.NewRequest(ctx, "one-too-many", params); err != nil {
		t.Fatalf("after expiry the session's budget is back: %v", err)
	}
}

// A connected client's holds outlive its request's expiry: it may still be
// writing the reserved slots, and freeing them could let that late write
// land in a block another client stored.
func TestExpiryKeepsWhatALiveClientHolds(t *testing.T) {
	e := startEnv(t, envOptions{limits: server.Limits{RequestIdleTimeout: time.Second}})
	ctx := ctxT(t)
	c := e.dial(t, e.unix)
	if _, err := c.NewRequest(ctx, "slow", ""); err != nil {
		t.Fatal(err)
	}
	ks := keys(7, 2)
	res, err := c.PrepareStore(ctx, "slow", ks, nil)
	if err != nil || len(res.Keys) != 2 {
		t.Fatalf("prepare store: %v, %v", res, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := c.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.GetExpiredRequests() == 1 {
			if p := st.GetPrimary().GetPendingSlots(); p != 2 {
				t.Fatalf("expiry freed the slots a connected client reserved: %d pending, want 2", p)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("request never expired")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, _, err := c.Lookup(ctx, "slow", ks, false); !strings.Contains(fmt.Sprint(err), "expired") {
		t.Fatalf("lookup on an expired request: %v, want an error that says it expired", err)
	}
	// The late store completes and is served.
	if err := c.CompleteStore(ctx, "slow", res.Keys, true); err != nil {
		t.Fatalf("complete store after expiry: %v", err)
	}
	st, err := c.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.GetPrimary().GetPendingSlots() != 0 || st.GetActiveRequests() != 0 {
		t.Fatalf("after the late completion: %d pending, %d requests", st.GetPrimary().GetPendingSlots(), st.GetActiveRequests())
	}
}

// A request costs its params' size, not twenty-five times it.
func TestRequestMemoryIsItsParams(t *testing.T) {
	e := startEnv(t, envOptions{})
	ctx := ctxT(t)
	c := e.dial(t, e.unix)
	params := `{"junk":[` + strings.Repeat(`1,`, 30000) + `1]}` // 60 001 bytes of JSON
	heap := func() uint64 {
		var m runtime.MemStats
		runtime.GC()
		runtime.GC()
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	before := heap()
	const n = 50
	for i := range n {
		if _, err := c.NewRequest(ctx, fmt.Sprint("r", i), params); err != nil {
			t.Fatal(err)
		}
	}
	perRequest := (float64(heap()) - float64(before)) / n
	t.Logf("%.0f bytes of heap per request with %d bytes of params", perRequest, len(params))
	if perRequest > 2*float64(len(params)) {
		t.Fatalf("a request with %d bytes of params costs %.0f bytes of heap", len(params), perRequest)
	}
}

// Finding 6: a client that only calls PutBlocks and never ScheduleEnd
// filled the primary with blocks pinned by cascades nobody collected, and
// then everyone got "primary tier full", which did not say why. The
// daemon now ends steps itself when no engine does, and a refusal names
// what holds the slots.
func TestStoresWithoutScheduleEnd(t *testing.T) {
	e := startEnv(t, envOptions{slots: 16, tiers: func(t envT) []offload.SecondaryTier {
		m, err := memory.New(memory.Config{Name: "slowish", Medium: offload.MediumStorage, Locality: offload.LocalityLocal, Latency: time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		return []offload.SecondaryTier{m}
	}})
	ctx := ctxT(t)
	c := e.dial(t, e.unix)
	for round := range 35 {
		var blocks []client.Block
		for _, k := range keys(1000+4*round, 4) {
			blocks = append(blocks, client.Block{Key: k, Data: content(k)})
		}
		if _, err := c.PutBlocks(ctx, blocks, client.CallOptions{}); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
	}
	// Nobody ends a step, yet the cascades complete and release their
	// pins: the daemon ends steps for the idle engine.
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := c.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ts := st.GetTiers()[0]
		if st.GetAutoSteps() > 0 && ts.GetCascadesOk()+ts.GetCascadesDropped() == 35 && st.GetCascadePinnedSlots() == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("cascades never collected without ScheduleEnd: %d auto steps, %d ok, %d dropped, %d pinned",
				st.GetAutoSteps(), ts.GetCascadesOk(), ts.GetCascadesDropped(), st.GetCascadePinnedSlots())
		}
		time.Sleep(10 * time.Millisecond)
	}
	// When the slots really are held, the error says by what.
	// The hog looks in the primary only: a lookup that found a block in
	// the tier would promote it, evicting one of those it is to pin.
	if _, err := c.NewRequest(ctx, "hog", `{"kv_load_tiers":[]}`); err != nil {
		t.Fatal(err)
	}
	// Pin every block the primary holds (the last ones stored, except
	// any a cascade in service kept from eviction).
	var held []offload.Key
	all := keys(1000, 4*35)
	res, _, err := c.Lookup(ctx, "hog", all, false)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r == kvtierv1.LookupResult_LOOKUP_RESULT_HIT {
			held = append(held, all[i])
		}
	}
	if len(held) != 16 {
		t.Fatalf("%d blocks in a full 16-slot primary", len(held))
	}
	if _, err := c.PrepareLoad(ctx, "hog", held); err != nil {
		t.Fatal(err)
	}
	_, err = c.PutBlocks(ctx, []client.Block{{Key: keys(5000, 1)[0], Data: content(keys(5000, 1)[0])}}, client.CallOptions{})
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "16 are pinned by readers") || !strings.Contains(err.Error(), "1 active requests hold pins or reservations") {
		t.Fatalf("store into a primary pinned by one reader: %v", err)
	}
}

// rawCodec sends bytes as they are, to send a request that is not a
// valid protobuf message.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *(v.(*[]byte)), nil }
func (rawCodec) Unmarshal(data []byte, v any) error {
	*(v.(*[]byte)) = append([]byte(nil), data...)
	return nil
}
func (rawCodec) Name() string { return "proto" }

var _ encoding.Codec = rawCodec{}

// Finding 9: a malformed protobuf message answered INTERNAL, which tells a
// client the daemon is broken rather than its input.
func TestMalformedMessageIsInvalidArgument(t *testing.T) {
	e := startEnv(t, envOptions{})
	conn, err := grpc.NewClient("unix://"+e.unix, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	garbage := []byte{0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f} // field 1, length beyond the message
	var reply []byte
	err = conn.Invoke(ctxT(t), "/kvtier.v1.KVTier/NewRequest", &garbage, &reply, grpc.ForceCodec(rawCodec{}))
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "malformed request message") {
		t.Fatalf("malformed NewRequest: %v", err)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		t.Fatal(err)
	}
}

// Request ids are the session's own: two engines may use the same ids,
// and neither can name the other's requests.
func TestRequestIDsAreScopedToTheSession(t *testing.T) {
	e := startEnv(t, envOptions{})
	ctx := ctxT(t)
	a, b := e.dial(t, e.unix), e.dial(t, e.tcp)
	for _, c := range []*client.Client{a, b} {
		if _, err := c.NewRequest(ctx, "req-1", ""); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.FinishRequest(ctx, "req-1"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.Lookup(ctx, "req-1", keys(1, 1), false); err != nil {
		t.Fatalf("b's request went with a's: %v", err)
	}
	if err := a.FinishRequest(ctx, "req-1"); status.Code(err) != codes.NotFound {
		t.Fatalf("a finished its request twice, or b's: %v", err)
	}
}
