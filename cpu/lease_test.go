package cpu

import (
	"errors"
	"fmt"
	"testing"

	"pgregory.net/rapid"

	"github.com/kvtier/kvtier/offload"
)

func leaseKey(i int) offload.Key { return offload.MakeKey([]byte(fmt.Sprintf("lease-%04d", i)), 0) }

func newLeasePrimary(t interface{ Fatal(...any) }, slots int, policy string) *Primary {
	p, err := New(Config{SlotSize: 64, Capacity: int64(slots * 64), Policy: policy, Events: true})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLeaseBindUnlease(t *testing.T) {
	p := newLeasePrimary(t, 4, "lru")
	// Two ready blocks, one pinned.
	out, ok := p.PrepareStore([]offload.Key{leaseKey(1), leaseKey(2)})
	if !ok {
		t.Fatal("prepare store")
	}
	p.CompleteStore(out.KeysToStore, true)
	if _, err := p.PrepareLoad([]offload.Key{leaseKey(1)}); err != nil {
		t.Fatal(err)
	}
	p.TakeEvents()

	// Four wanted: two free slots, one evictable block; the pinned one
	// stays, so three are leased.
	slots, evicted := p.Lease(4)
	if len(slots) != 3 || len(evicted) != 1 || evicted[0] != leaseKey(2) {
		t.Fatalf("lease: slots %v, evicted %v", slots, evicted)
	}
	if st := p.Stats(); st.Leased != 3 || st.FreeSlots != 0 || st.Blocks != 1 {
		t.Fatalf("stats %+v", st)
	}
	// A leased slot is invisible and untouched by Reset.
	p.Reset()
	if st := p.Stats(); st.Leased != 3 {
		t.Fatalf("Reset freed leased slots: %+v", st)
	}
	bound, err := p.Bind(slots[0], leaseKey(3))
	if err != nil || !bound {
		t.Fatalf("bind: %v %v", bound, err)
	}
	if p.Lookup(leaseKey(3)) != offload.Hit {
		t.Fatal("a bound block is not a hit")
	}
	if s, _ := p.SlotOf(leaseKey(3)); s != slots[0] {
		t.Fatalf("bound to slot %d, want %d", s, slots[0])
	}
	if ev := p.TakeEvents(); len(ev) != 2 || !ev[1].Keys[0].Valid() || ev[1].Keys[0] != leaseKey(3) || ev[1].Removed {
		t.Fatalf("events %+v, want the eviction then the stored block", ev)
	}
	// A copy of a present key frees its slot.
	bound, err = p.Bind(slots[1], leaseKey(1))
	if err != nil || bound || p.Leased(slots[1]) {
		t.Fatalf("duplicate bind: %v %v", bound, err)
	}
	if _, err := p.Bind(slots[1], leaseKey(4)); !errors.Is(err, ErrNotLeased) {
		t.Fatalf("bind of a freed slot: %v", err)
	}
	if err := p.Unlease([]int64{slots[2], slots[2]}); !errors.Is(err, ErrNotLeased) {
		t.Fatalf("unlease listing a slot twice: %v", err)
	}
	if err := p.Unlease([]int64{slots[2]}); err != nil {
		t.Fatal(err)
	}
	if st := p.Stats(); st.Leased != 0 || st.FreeSlots != 2 || st.Blocks != 2 {
		t.Fatalf("after: %+v", st)
	}
}

// Random leases, binds, unleases, stores and pins: every slot is exactly
// one of free, keyed or leased; the index never names a leased slot; a
// bound block holds its key.
func TestLeaseModel(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		policy := rapid.SampledFrom([]string{"lru", "arc"}).Draw(rt, "policy")
		p := newLeasePrimary(rt, 6, policy)
		var leased []int64
		pinned := map[offload.Key]int{}
		rt.Repeat(map[string]func(*rapid.T){
			"lease": func(rt *rapid.T) {
				s, _ := p.Lease(rapid.IntRange(1, 4).Draw(rt, "n"))
				leased = append(leased, s...)
			},
			"bind": func(rt *rapid.T) {
				if len(leased) == 0 {
					rt.Skip("none")
				}
				i := rapid.IntRange(0, len(leased)-1).Draw(rt, "i")
				k := leaseKey(rapid.IntRange(0, 9).Draw(rt, "k"))
				if _, err := p.Bind(leased[i], k); err != nil {
					rt.Fatal(err)
				}
				leased = append(leased[:i], leased[i+1:]...)
				if p.Lookup(k) != offload.Hit {
					rt.Fatalf("%v not present after bind", k)
				}
			},
			"unlease": func(rt *rapid.T) {
				if len(leased) == 0 {
					rt.Skip("none")
				}
				if err := p.Unlease(leased[:1]); err != nil {
					rt.Fatal(err)
				}
				leased = leased[1:]
			},
			"store": func(rt *rapid.T) {
				k := leaseKey(rapid.IntRange(0, 9).Draw(rt, "k"))
				if out, ok := p.PrepareStore([]offload.Key{k}); ok {
					p.CompleteStore(out.KeysToStore, rapid.Bool().Draw(rt, "ok"))
				}
			},
			"pin": func(rt *rapid.T) {
				k := leaseKey(rapid.IntRange(0, 9).Draw(rt, "k"))
				if p.Lookup(k) == offload.Hit {
					if _, err := p.PrepareLoad([]offload.Key{k}); err == nil {
						pinned[k]++
					}
				}
			},
			"unpin": func(rt *rapid.T) {
				for k := range pinned {
					p.CompleteLoad([]offload.Key{k})
					if pinned[k]--; pinned[k] == 0 {
						delete(pinned, k)
					}
					return
				}
			},
			"": func(rt *rapid.T) {
				st := p.Stats()
				if st.Blocks+st.Leased+st.FreeSlots != st.NumSlots || st.Leased != len(leased) {
					rt.Fatalf("slots do not add up: %+v (test holds %d leases)", st, len(leased))
				}
				for _, s := range leased {
					if !p.Leased(s) || p.b.meta[s].key != "" {
						rt.Fatalf("slot %d lost its lease", s)
					}
				}
				for k := 0; k < 10; k++ {
					if s, ok := p.SlotOf(leaseKey(k)); ok && p.Leased(s) {
						rt.Fatalf("the index names leased slot %d", s)
					}
				}
			},
		})
	})
}
