package server_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	kvtierv1 "github.com/kvtier/kvtier/api/kvtier/v1"
	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/events/zmtp"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/server"
	"github.com/kvtier/kvtier/tiers/memory"
	"github.com/kvtier/kvtier/tiers/peer"
	rt "github.com/kvtier/kvtier/tiers/remote/remotetest"
)

// Tests of the peer tier's event index against a real daemon that
// publishes its KV events: the tier lists the daemon's blocks once, then
// follows its events, and answers lookups without asking.

const indexWait = 30 * time.Second

func newIndexedTier(t *testing.T, e *env) *peer.Tier {
	t.Helper()
	tier, err := peer.New(peer.Config{Name: "fleet", Peers: []peer.PeerConfig{{Name: "a", Addr: e.tcp}},
		ResyncInterval: 50 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tier.Close(context.Background()) })
	return tier
}

func put(t *testing.T, c *client.Client, ks []offload.Key) {
	t.Helper()
	blocks := make([]client.Block, len(ks))
	for i, k := range ks {
		blocks[i] = client.Block{Key: k, Data: block(k)}
	}
	if _, err := c.PutBlocks(ctxT(t), blocks, client.CallOptions{}); err != nil {
		t.Fatal(err)
	}
}

// waitIndex waits until the tier's index of its first peer is current and
// holds n blocks.
func waitIndex(t *testing.T, tier *peer.Tier, n int64) peer.PeerStats {
	t.Helper()
	var st peer.PeerStats
	rt.Eventually(t, indexWait, fmt.Sprintf("an index of %d blocks", n), func() bool {
		st = tier.Peers()[0]
		return st.Indexed && st.IndexKeys == n
	})
	return st
}

func TestPeerIndexFollowsEvents(t *testing.T) {
	e := startEnv(t, envOptions{slots: 64, tiers: noTiers, publish: true})
	c := e.dial(t, e.unix)
	// Held before the tier starts: found by the pass over the block list.
	put(t, c, keys(0, 10))
	tier := newIndexedTier(t, e)
	st := waitIndex(t, tier, 10)
	if st.Syncs != 1 {
		t.Errorf("syncs %d, want 1", st.Syncs)
	}
	req, _ := offload.NewReqContext("r", nil)
	for _, k := range keys(0, 10) {
		if r := tier.Lookup(k, req); r != offload.Hit {
			t.Fatalf("%s: %v from a current index", k, r)
		}
	}
	// A block the peer does not hold is a miss at once, not a Retry.
	if r := tier.Lookup(key(99), req); r != offload.Miss {
		t.Fatalf("unknown block: %v", r)
	}
	if got := tier.Peers()[0].Contacts; got != 0 {
		t.Errorf("%d calls to the peer for lookups answered by the index", got)
	}

	// Stored after: the events add them.
	put(t, c, keys(10, 5))
	waitIndex(t, tier, 15)
	if r := tier.Lookup(key(12), req); r != offload.Hit {
		t.Fatalf("block stored after the pass: %v", r)
	}
	// A load of an indexed block brings the peer's bytes.
	arena := rt.NewArena(slotSize, 1)
	job := &offload.Job{ID: 1, Keys: []offload.Key{key(12)}, Slots: []int64{0}, Arena: arena, Req: req, Promotion: true}
	if res := rt.Run(t, tier, job); !res.Success {
		t.Fatalf("load: %v", res.Err)
	}
	if got, _ := arena.Slot(0); !bytes.Equal(got, block(key(12))) {
		t.Fatal("loaded bytes differ")
	}

	// Evicted (the primary holds 64): the events remove them.
	put(t, c, keys(100, 64))
	waitIndex(t, tier, 64)
	if r := tier.Lookup(key(0), req); r != offload.Miss {
		t.Fatalf("evicted block: %v", r)
	}
	// A reset publishes no events (docs/semantics.md §4.9): the index still says held,
	// the load finds the block gone — a miss, not wrong bytes — and the
	// index forgets it.
	if err := c.Reset(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	job = &offload.Job{ID: 2, Keys: []offload.Key{key(120)}, Slots: []int64{0}, Arena: arena, Req: req, Promotion: true}
	if res := rt.Run(t, tier, job); res.Success || len(res.SuccessfulKeys) != 0 {
		t.Fatalf("load after the peer's reset: %+v", res)
	}
	waitIndex(t, tier, 63)
	if r := tier.Lookup(key(120), req); r != offload.Miss {
		t.Fatalf("after the failed load: %v", r)
	}
}

// A peer without events (or with index off) is asked every step, as
// before; the index never claims to be current.
func TestPeerIndexColdWithoutEvents(t *testing.T) {
	e := startEnv(t, envOptions{slots: 64, tiers: noTiers})
	c := e.dial(t, e.unix)
	put(t, c, keys(0, 3))
	tier := newIndexedTier(t, e)
	req, _ := offload.NewReqContext("r", nil)
	if r := rt.Resolve(t, tier, key(1), req); r != offload.Hit {
		t.Fatalf("asked lookup: %v", r)
	}
	st := tier.Peers()[0]
	if st.Indexed || st.Contacts == 0 {
		t.Fatalf("indexed %v, contacts %d: want cold and asked", st.Indexed, st.Contacts)
	}
}

// dropProxy relays a publisher's batches to subscribers of its own PUB
// socket, except those whose sequence numbers it is told to drop: a
// network that lost batches, as a subscriber sees it.
type dropProxy struct {
	pub  *zmtp.PubSocket
	port int
	mu   sync.Mutex
	drop map[uint64]bool
	seen uint64 // highest seq relayed or dropped, +1
	cond *sync.Cond
}

func startDropProxy(t *testing.T, upstream string) *dropProxy {
	t.Helper()
	d := &dropProxy{pub: zmtp.NewPub(zmtp.PubOptions{}), drop: map[uint64]bool{}}
	d.cond = sync.NewCond(&d.mu)
	addr, err := d.pub.Bind("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d.port = addr.(*net.TCPAddr).Port
	sub, err := zmtp.Dial(ctxT(t), "tcp://"+upstream, zmtp.Sub, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.Subscribe(nil); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			msg, err := sub.Recv()
			if err != nil {
				return
			}
			seq := binary.BigEndian.Uint64(msg[1])
			d.mu.Lock()
			drop := d.drop[seq]
			d.seen = seq + 1
			d.cond.Broadcast()
			d.mu.Unlock()
			if !drop {
				d.pub.Send(msg)
			}
		}
	}()
	t.Cleanup(func() {
		sub.Close()
		<-done
		d.pub.Close(context.Background())
	})
	return d
}

// startDroppingEnv starts a daemon of slots slots publishing its events
// (replay keeping replaySteps batches, 0 = vLLM's default) whose
// ListBlocks sends subscribers to a dropProxy in front of its publisher.
func startDroppingEnv(t *testing.T, slots, replaySteps int) (*env, *dropProxy) {
	t.Helper()
	var proxy *dropProxy
	var mu sync.Mutex
	e := startEnv(t, envOptions{slots: slots, tiers: noTiers, publish: true, replaySteps: replaySteps, feed: func(f server.EventFeed) server.EventFeed {
		mu.Lock()
		defer mu.Unlock()
		if proxy != nil {
			f.Port = proxy.port
		}
		return f
	}})
	mu.Lock()
	proxy = startDropProxy(t, e.pub.Addr().String())
	mu.Unlock()
	return e, proxy
}

// dropNext drops the next n batches after those seen so far.
func (d *dropProxy) dropNext(n int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for i := range uint64(n) {
		d.drop[d.seen+i] = true
	}
}

// Batches lost on the way are fetched from the peer's replay socket: the
// index ends exact without another pass; when replay no longer has them,
// the tier passes over the block list again.
func TestPeerIndexGapReplayAndResync(t *testing.T) {
	for _, tc := range []struct {
		name       string
		steps      int // replay buffer
		wantResync bool
	}{
		{"replay fills the gap", 0, false},
		{"replay lost them: resync", 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, proxy := startDroppingEnv(t, 64, tc.steps)
			c := e.dial(t, e.unix)
			tier := newIndexedTier(t, e)
			waitIndex(t, tier, 0)
			put(t, c, keys(0, 4))
			waitIndex(t, tier, 4)
			// Three batches lost, then one that arrives and shows the gap.
			proxy.dropNext(3)
			for i := range 4 {
				put(t, c, keys(10+i, 1))
			}
			st := waitIndex(t, tier, 8)
			if st.Gaps == 0 {
				t.Fatal("no gap seen")
			}
			if tc.wantResync {
				if st.Syncs < 2 {
					t.Errorf("syncs %d: want a second pass", st.Syncs)
				}
			} else if st.Syncs != 1 || st.Replayed < 3 {
				t.Errorf("syncs %d, replayed %d: want the gap filled by replay", st.Syncs, st.Replayed)
			}
			req, _ := offload.NewReqContext("r", nil)
			for _, k := range append(keys(0, 4), keys(10, 4)...) {
				if r := tier.Lookup(k, req); r != offload.Hit {
					t.Fatalf("%s: %v after the gap", k, r)
				}
			}
		})
	}
}

// ListBlocks pages through the primary's ready blocks and says where the
// events are; a negative cursor is refused.
func TestListBlocks(t *testing.T) {
	e := startEnv(t, envOptions{slots: 64, tiers: noTiers, publish: true})
	c := e.dial(t, e.tcp)
	put(t, c, keys(0, 10))
	got := map[offload.Key]bool{}
	cursor, pages := int64(0), 0
	for {
		r, err := c.ListBlocks(ctxT(t), cursor, 3)
		if err != nil {
			t.Fatal(err)
		}
		pages++
		if len(r.GetKeys()) > 3 {
			t.Fatalf("page of %d keys, limit 3", len(r.GetKeys()))
		}
		if r.GetEventsPort() != int32(e.pub.Addr().(*net.TCPAddr).Port) || r.GetEventsReplayPort() == 0 || r.GetEventsTopic() != e.pub.Topic() || r.GetEventsCpuMedium() != "CPU" {
			t.Fatalf("feed: %v", r)
		}
		for _, k := range r.GetKeys() {
			got[offload.Key(k)] = true
		}
		if cursor = r.GetNextCursor(); cursor == 0 {
			break
		}
	}
	if len(got) != 10 || pages < 4 {
		t.Fatalf("%d keys in %d pages", len(got), pages)
	}
	for _, k := range keys(0, 10) {
		if !got[k] {
			t.Fatalf("%s not listed", k)
		}
	}
	if _, err := c.ListBlocks(ctxT(t), -1, 0); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("negative cursor: %v", err)
	}
}

func storageTier(t envT) []offload.SecondaryTier {
	m, err := memory.New(memory.Config{Name: "disk", Medium: offload.MediumStorage, Locality: offload.LocalityLocal, Events: true})
	if err != nil {
		t.Fatal(err)
	}
	return []offload.SecondaryTier{m}
}

// With from_storage, a block the peer holds on its storage tier (not in
// its DRAM) loads for a request that allows storage at the peer's
// locality, promoted on the peer first; a CPU-only request does not load
// it, nor does a tier without from_storage.
func TestPeerFromStorage(t *testing.T) {
	e := startEnv(t, envOptions{slots: 8, tiers: storageTier, publish: true})
	c := e.dial(t, e.unix)
	k := key(1)
	newTier := func(fromStorage bool) *peer.Tier {
		tier, err := peer.New(peer.Config{Name: "fleet", Peers: []peer.PeerConfig{{Name: "a", Addr: e.tcp}},
			FromStorage: fromStorage, Timeout: 10 * time.Second, ResyncInterval: 50 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tier.Close(context.Background()) })
		return tier
	}
	both, dramOnly := newTier(true), newTier(false)
	// Storage hints come from events (the block list covers the DRAM):
	// store once both follow A.
	waitIndex(t, both, 0)
	waitIndex(t, dramOnly, 0)
	put(t, c, []offload.Key{k})
	cpuReq, _ := offload.NewReqContext("cpu", []byte(`{"kv_load_tiers":[{"medium":"cpu"}]}`))
	diskReq, _ := offload.NewReqContext("disk", []byte(`{"kv_load_tiers":[{"medium":"storage"}]}`))
	// The block reaches A's storage tier (a cascade), then leaves A's DRAM.
	rt.Eventually(t, indexWait, "the block on A's storage tier", func() bool { return both.Lookup(k, diskReq) == offload.Hit })
	// Push it out of A's DRAM (once its cascade has let it go).
	inDRAM := func() bool {
		r, err := c.ListBlocks(ctxT(t), 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range r.GetKeys() {
			if offload.Key(b) == k {
				return true
			}
		}
		return false
	}
	unpinned := func() bool {
		st, err := c.Stats(ctxT(t))
		return err == nil && st.GetCascadePinnedSlots() == 0
	}
	for i := 0; inDRAM(); i++ {
		if i == 50 {
			t.Fatal("the block stays in A's DRAM")
		}
		rt.Eventually(t, indexWait, "cascades done", unpinned)
		put(t, c, keys(100+4*i, 4))
	}
	rt.Eventually(t, indexWait, "the block out of A's DRAM", func() bool { return both.Lookup(k, cpuReq) == offload.Miss })
	if r := both.Lookup(k, diskReq); r != offload.Hit {
		t.Fatalf("storage-allowed lookup: %v", r)
	}
	if r := dramOnly.Lookup(k, diskReq); r != offload.Miss {
		t.Fatalf("tier without from_storage: %v", r)
	}
	arena := rt.NewArena(slotSize, 1)
	job := &offload.Job{ID: 1, Keys: []offload.Key{k}, Slots: []int64{0}, Arena: arena, Req: diskReq, Promotion: true}
	if res := rt.Run(t, both, job); !res.Success {
		t.Fatalf("load from the peer's storage: %v", res.Err)
	}
	if got, _ := arena.Slot(0); !bytes.Equal(got, block(k)) {
		t.Fatal("bytes differ")
	}
}

// The index agrees with the peer after any sequence of stores (with
// evictions), reads, resets and lost batches, once it has caught up: a
// block is a hit exactly when the peer's primary holds it. After a reset
// (which publishes nothing) the index may claim blocks the peer dropped;
// loads of those are misses, never wrong bytes, and the index forgets
// them. Every load that succeeds brings the peer's bytes.
func TestPeerIndexModel(t *testing.T) {
	for seed := range uint64(30) {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) { peerIndexRun(t, rand.New(rand.NewPCG(seed, 1))) })
	}
}

// peerIndexRun is one random sequence of TestPeerIndexModel; each
// subtest has its own daemon, closed when it ends.
func peerIndexRun(t *testing.T, rnd *rand.Rand) {
	e, proxy := startDroppingEnv(t, 16, 0)
	c := e.dial(t, e.unix)
	tier := newIndexedTier(t, e)
	waitIndex(t, tier, 0)
	req, _ := offload.NewReqContext("m", nil)
	pool := keys(0, 40)
	arena := rt.NewArena(slotSize, 4)
	jobID := uint64(0)
	held := func() map[offload.Key]bool {
		out := map[offload.Key]bool{}
		for cursor := int64(0); ; {
			r, err := c.ListBlocks(ctxT(t), cursor, 0)
			if err != nil {
				t.Fatal(err)
			}
			for _, k := range r.GetKeys() {
				out[offload.Key(k)] = true
			}
			if cursor = r.GetNextCursor(); cursor == 0 {
				return out
			}
		}
	}
	load := func(ks []offload.Key) {
		jobID++
		job := &offload.Job{ID: jobID, Keys: ks, Slots: rt.Slots(0, len(ks)), Arena: arena, Req: req, Promotion: true}
		res := rt.Run(t, tier, job)
		for _, k := range res.SuccessfulKeys {
			i := slices.Index(ks, k)
			if got, _ := arena.Slot(int64(i)); !bytes.Equal(got, block(k)) {
				t.Fatalf("load of %s brought other bytes", k)
			}
		}
	}
	reset := false
	for range 1 + rnd.IntN(25) {
		switch rnd.IntN(10) {
		case 0:
			if err := c.Reset(ctxT(t)); err != nil {
				t.Fatal(err)
			}
			reset = true
		case 1:
			proxy.dropNext(1 + rnd.IntN(3))
		case 2, 3:
			n := 1 + rnd.IntN(4)
			var ks []offload.Key
			for range n {
				ks = append(ks, pool[rnd.IntN(len(pool))])
			}
			load(slices.Compact(ks))
		default:
			n := 1 + rnd.IntN(4)
			start := rnd.IntN(len(pool) - n + 1)
			put(t, c, pool[start:start+n])
		}
	}
	// A batch after any dropped ones, so that a gap shows.
	proxy.mu.Lock()
	clear(proxy.drop)
	proxy.mu.Unlock()
	put(t, c, keys(100, 1))
	r, err := c.ListBlocks(ctxT(t), 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	rt.Eventually(t, indexWait, "the index caught up", func() bool {
		st := tier.Peers()[0]
		return st.Indexed && st.NextSeq == r.GetEventsNextSeq()
	})
	all := append(slices.Clone(pool), keys(100, 1)...)
	if reset {
		// What a reset dropped silently: loads find it gone and the
		// index forgets it.
		var claimed []offload.Key
		for _, k := range all {
			if tier.Lookup(k, req) == offload.Hit {
				claimed = append(claimed, k)
			}
		}
		for len(claimed) > 0 {
			n := min(4, len(claimed))
			load(claimed[:n])
			claimed = claimed[n:]
		}
	}
	want := held()
	rt.Eventually(t, indexWait, "the index to match the peer", func() bool {
		for _, k := range all {
			if (tier.Lookup(k, req) == offload.Hit) != want[k] {
				return false
			}
		}
		return true
	})
}

// With push, a cascade to the peer tier stores each block in one peer's
// primary, as the request's store filter allows; the receiving daemon
// keeps a push to itself and its storage tiers and never passes it on to
// its own peers.
func TestPeerPush(t *testing.T) {
	// C is where A would pass blocks on, if pushes travelled.
	c := startEnv(t, envOptions{slots: 16, tiers: noTiers, stream: true})
	var aTiers []offload.SecondaryTier
	a := startEnv(t, envOptions{slots: 16, stream: true, tiers: func(tb envT) []offload.SecondaryTier {
		onward, err := peer.New(peer.Config{Name: "onward", Push: true, EventIndex: new(bool), Peers: []peer.PeerConfig{{Name: "c", Addr: c.tcp}}, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			tb.Fatal(err)
		}
		aTiers = append(storageTier(tb), onward)
		return aTiers
	}})
	tier, err := peer.New(peer.Config{Name: "fleet", Push: true, EventIndex: new(bool), Peers: []peer.PeerConfig{{Name: "a", Addr: a.tcp}}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer tier.Close(context.Background())
	if tier.ReadOnly() {
		t.Fatal("a push tier reports read-only")
	}
	arena := rt.NewArena(slotSize, 3)
	ks := keys(0, 3)
	for i, k := range ks {
		s, _ := arena.Slot(int64(i))
		copy(s, block(k))
	}
	// A store filter without the peer's locality pushes nothing.
	remoteOnly, _ := offload.NewReqContext("r", []byte(`{"kv_store_tiers":[{"locality":"remote"}]}`))
	if res := rt.Run(t, tier, &offload.Job{ID: 1, Keys: ks[:1], Slots: []int64{0}, Arena: arena, Req: remoteOnly}); !res.Success {
		t.Fatalf("filtered push: %v", res.Err)
	}
	req, _ := offload.NewReqContext("s", nil)
	if res := rt.Run(t, tier, &offload.Job{ID: 2, Keys: ks[1:], Slots: []int64{1, 2}, Arena: arena, Req: req}); !res.Success {
		t.Fatalf("push: %v", res.Err)
	}
	ac := a.dial(t, a.unix)
	got, err := ac.GetBlocks(ctxT(t), ks, client.GetOptions{CallOptions: client.CallOptions{Params: `{"kv_load_tiers":[]}`}})
	if err != nil {
		t.Fatal(err)
	}
	if got.Results[0] == kvtierv1.LookupResult_LOOKUP_RESULT_HIT {
		t.Error("a push the store filter excludes reached the peer")
	}
	for i := 1; i < 3; i++ {
		if got.Results[i] != kvtierv1.LookupResult_LOOKUP_RESULT_HIT || !bytes.Equal(got.Data[i], block(ks[i])) {
			t.Fatalf("pushed block %d: %v", i, got.Results[i])
		}
	}
	if st := tier.Peers()[0]; st.Pushed != 2 {
		t.Errorf("pushed %d, want 2", st.Pushed)
	}
	// A cascades the pushed blocks to its storage tier; its own push tier
	// gets them too but finds no peer the push's filter allows: C gets
	// nothing.
	rt.Eventually(t, indexWait, "A's cascades", func() bool {
		st, err := ac.Stats(ctxT(t))
		return err == nil && st.GetTiers()[0].GetCascadesOk() >= 1 && st.GetTiers()[1].GetCascadesOk() >= 1
	})
	if n := aTiers[1].(*peer.Tier).Peers()[0].Pushed; n != 0 {
		t.Errorf("A pushed %d blocks on to C", n)
	}
	if got, _ := c.dial(t, c.unix).GetBlocks(ctxT(t), ks, client.GetOptions{}); got.Hits != 0 {
		t.Errorf("C holds %d pushed blocks: the push travelled on", got.Hits)
	}
}
