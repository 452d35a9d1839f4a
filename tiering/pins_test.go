package tiering

import (
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/tiers/memory"
)

func withPins(pc PinConfig) func(*Config) {
	return func(c *Config) { c.Pins = pc }
}

func TestPinKeepsBlocksUntilTheTTL(t *testing.T) {
	clk := &fakeClock{now: time.Unix(1000, 0)}
	f := newFixture(t, withPins(PinConfig{Share: 0.4, Now: clk.Now}))
	f.m.OnNewRequest(f.ctx)
	f.store(f.ctx, keyRange(0, 3))
	f.step()
	// 5 slots, share 0.4: two pins; a key not in the primary is missing.
	a, err := f.m.Pin(append(keyRange(0, 3), K(9)), time.Minute)
	if err != nil || a != (PinAnswer{Pinned: 2, Missing: 1, Refused: 1}) {
		t.Fatalf("pin: %+v %v", a, err)
	}
	// Stores that need every slot cannot evict the pinned blocks.
	f.store(f.ctx, keyRange(10, 13))
	f.step()
	for _, k := range keyRange(0, 2) {
		if ref, ok := f.p.RefCount(k); !ok || ref < 1 {
			t.Fatalf("%v: pinned block gone or unpinned (ref %d, present %v)", k, ref, ok)
		}
	}
	// Pinning again extends the TTL without a second pin.
	clk.now = clk.now.Add(50 * time.Second)
	if a, err := f.m.Pin(keyRange(0, 1), time.Minute); err != nil || a.Pinned != 1 {
		t.Fatalf("pin again: %+v %v", a, err)
	}
	clk.now = clk.now.Add(20 * time.Second) // K1's TTL passed, K0's not
	f.step()
	if _, ok := f.m.Pinned(K(1)); ok {
		t.Fatal("K1 pinned past its TTL")
	}
	if _, ok := f.m.Pinned(K(0)); !ok || f.ref(K(0)) != 1 {
		t.Fatalf("K0 lost its extended pin (ref %d)", f.ref(K(0)))
	}
	if n := f.m.Unpin(keyRange(0, 3)); n != 1 || f.ref(K(0)) != 0 {
		t.Fatalf("unpin: %d, ref %d", n, f.ref(K(0)))
	}
	st := f.m.PinStats()
	if st.Pinned != 2 || st.Expired != 1 || st.Unpinned != 1 || st.Refused != 1 || st.Blocks != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestPinsSurviveAResetAndRefusals(t *testing.T) {
	f := newFixture(t)
	f.m.OnNewRequest(f.ctx)
	f.store(f.ctx, keyRange(0, 1))
	f.step()
	if _, err := f.m.Pin(keyRange(0, 1), time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := f.m.Reset(t.Context()); err != nil {
		t.Fatal(err)
	}
	if f.p.Lookup(K(0)) != offload.Hit {
		t.Fatal("a reset dropped a pinned block")
	}
	if _, err := f.m.Pin(keyRange(0, 1), 0); err == nil {
		t.Fatal("a pin without a TTL was taken")
	}
	g := newFixture(t, withPins(PinConfig{Share: -1}))
	if _, err := g.m.Pin(keyRange(0, 1), time.Hour); !errors.Is(err, ErrPinRefused) {
		t.Fatalf("pins off: %v", err)
	}
}

// A tier that chooses its own victims (offload.Keeper: here a memory tier
// of two blocks) passes over a pinned block while the pin lasts, and
// evicts it once it is unpinned (issue 41: pins are exempt from a
// secondary tier's own eviction).
func TestPinnedBlocksAreKeptByTiersThatEvict(t *testing.T) {
	mem, err := memory.New(memory.Config{Name: "disk", Medium: offload.MediumStorage, Locality: offload.LocalityLocal, CapacityBlocks: 2})
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, func(c *Config) { c.Tiers = []offload.SecondaryTier{mem} })
	f.m.OnNewRequest(f.ctx)
	landed := func(k offload.Key) {
		t.Helper()
		for !mem.Contains(k) {
			if t.Context().Err() != nil {
				t.Fatalf("%v never reached the tier", k)
			}
			f.step()
			runtime.Gosched()
		}
	}
	f.store(f.ctx, keyRange(0, 1))
	landed(K(0))
	if a, err := f.m.Pin([]offload.Key{K(0)}, time.Hour); err != nil || a.Pinned != 1 {
		t.Fatalf("pin: %+v %v", a, err)
	}
	for i := 1; i < 6; i++ {
		f.store(f.ctx, keyRange(i, i+1))
		landed(K(i))
		if !mem.Contains(K(0)) {
			t.Fatalf("the tier evicted the pinned block for K%d", i)
		}
	}
	if mem.Len() != 2 {
		t.Fatalf("the tier holds %d blocks, capacity 2", mem.Len())
	}
	f.m.Unpin([]offload.Key{K(0)})
	f.store(f.ctx, keyRange(6, 7))
	landed(K(6))
	if mem.Contains(K(0)) {
		t.Fatal("the unpinned block, least recently used, was not the victim")
	}
}
