package memory

import (
	"errors"
	"fmt"
	"testing"

	"pgregory.net/rapid"

	"github.com/kvtier/kvtier/keyspace"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/quota"
)

const shareBlock = 4 // bytes per block in these tests

// TestSharesModel drives a memory tier whose capacity is divided between
// tenants with random stores (jobs and Puts), loads, touches and removals
// and checks after each step: the tier never holds more than its
// capacity, a block leaves only when its owner was above its quota or
// stored it itself (or it was removed), every held block keeps its bytes,
// and the recency lists match the map.
func TestSharesModel(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		nTenants := rapid.IntRange(1, 3).Draw(rt, "tenants")
		capacity := rapid.IntRange(2, 12).Draw(rt, "capacity")
		spaces := make([]keyspace.Space, nTenants)
		var list []quota.Share
		left := capacity
		for i := range spaces {
			spaces[i], _ = keyspace.Tenant(fmt.Sprint("t", i))
			q := rapid.IntRange(0, left).Draw(rt, fmt.Sprint("quota", i))
			left -= q
			w := rapid.SampledFrom([]float64{0, 1, 2, 0.5}).Draw(rt, fmt.Sprint("weight", i))
			list = append(list, quota.Share{Space: spaces[i].ID(), Quota: int64(q*shareBlock + rapid.IntRange(0, shareBlock-1).Draw(rt, "odd")), Weight: w})
		}
		tier, err := New(Config{CapacityBlocks: capacity, Shares: list, BlockBytes: shareBlock, Events: true})
		if err != nil {
			rt.Fatal(err)
		}
		defer tier.Close(rt.Context())
		// owner index (0: untagged pool) of a model key.
		keyOf := func(owner, n int) offload.Key {
			raw := offload.MakeKey(fmt.Appendf(nil, "%d/%d", owner, n), 0)
			if owner == 0 {
				return raw
			}
			return spaces[owner-1].Key([]byte(raw))
		}
		quotaBlocks := func(o int) int {
			if o == 0 {
				q := capacity
				for _, s := range list {
					q -= int(s.Quota / shareBlock)
				}
				return q
			}
			return int(list[o-1].Quota / shareBlock)
		}
		held := map[offload.Key][]byte{}
		ownerOf := map[offload.Key]int{}
		count := func(o int) int {
			n := 0
			for k := range held {
				if ownerOf[k] == o {
					n++
				}
			}
			return n
		}
		a := newArena(2, shareBlock)
		id := uint64(0)
		for step := range rapid.IntRange(1, 60).Draw(rt, "steps") {
			o := rapid.IntRange(0, nTenants).Draw(rt, "owner")
			k := keyOf(o, rapid.IntRange(0, 15).Draw(rt, "key"))
			before := map[int]int{}
			for x := 0; x <= nTenants; x++ {
				before[x] = count(x)
			}
			data := []byte{byte(step), byte(o), 7, 9}
			stored, refused := false, false
			switch rapid.IntRange(0, 4).Draw(rt, "op") {
			case 0: // a store job
				copy(a.buf[:shareBlock], data)
				id++
				store(tier, a, id, []offload.Key{k}, 0)
				r := collect(t, tier, 1)[0]
				if _, had := held[k]; had {
					break // refreshed, its bytes unchanged
				}
				switch {
				case r.Success:
					stored = true
				case errors.Is(r.Err, ErrFull):
					refused = true
				default:
					rt.Fatalf("store: %v", r.Err)
				}
			case 1: // a direct Put
				if _, had := held[k]; had {
					break
				}
				stored = tier.Put(k, data)
				refused = !stored
			case 2: // a load
				id++
				tier.SubmitLoad(&offload.Job{ID: id, Keys: []offload.Key{k}, Slots: []int64{1}, Arena: a, Req: offload.Background("r")})
				r := collect(t, tier, 1)[0]
				if want, ok := held[k]; ok != r.Success || ok && string(a.buf[shareBlock:]) != string(want) {
					rt.Fatalf("load of %v: %+v, model holds it: %v", k, r, ok)
				}
			case 3:
				tier.Touch([]offload.Key{k}, nil)
			case 4:
				if tier.Remove(k) != (held[k] != nil) {
					rt.Fatalf("remove of %v disagrees with the model", k)
				}
				delete(held, k)
			}
			if stored {
				held[k], ownerOf[k] = data, o
			}
			// What left: only what the tier's own state says.
			for hk, want := range held {
				got, ok := tier.Get(hk)
				if !ok {
					x := ownerOf[hk]
					if !stored || (x != o && before[x] <= quotaBlocks(x)) {
						rt.Fatalf("step %d: owner %d's block evicted (it held %d, quota %d) by owner %d's store %v", step, x, before[x], quotaBlocks(x), o, stored)
					}
					delete(held, hk)
					continue
				}
				if string(got) != string(want) {
					rt.Fatalf("block %v holds %v, want %v", hk, got, want)
				}
			}
			if n := tier.Len(); n > capacity || n != len(held) || tier.listLen() != n {
				rt.Fatalf("tier holds %d (lists %d), model %d, capacity %d", n, tier.listLen(), len(held), capacity)
			}
			// A refused store: every other owner within its quota.
			if refused {
				for x := 0; x <= nTenants; x++ {
					if x != o && count(x) > quotaBlocks(x) {
						rt.Fatalf("owner %d refused while owner %d holds %d > quota %d", o, x, count(x), quotaBlocks(x))
					}
				}
			}
		}
		var rep int64
		for _, s := range tier.Report().Shares {
			rep += s.Bytes
		}
		if rep != int64(len(held)*shareBlock) {
			rt.Fatalf("report: %d bytes of shares, model %d", rep, len(held)*shareBlock)
		}
	})
}

func TestSharesConfigErrors(t *testing.T) {
	acme, _ := keyspace.Tenant("acme")
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"unbounded tier", Config{BlockBytes: 4, Shares: []quota.Share{{Space: acme.ID(), Quota: 4}}}},
		{"no block size", Config{CapacityBlocks: 4, Shares: []quota.Share{{Space: acme.ID(), Quota: 4}}}},
		{"over capacity", Config{CapacityBlocks: 4, BlockBytes: 4, Shares: []quota.Share{{Space: acme.ID(), Quota: 20}}}},
		{"space 0", Config{CapacityBlocks: 4, BlockBytes: 4, Shares: []quota.Share{{Quota: 4}}}},
		{"twice", Config{CapacityBlocks: 4, BlockBytes: 4, Shares: []quota.Share{{Space: acme.ID(), Quota: 4}, {Space: acme.ID(), Quota: 4}}}},
	} {
		if tier, err := New(tc.cfg); err == nil {
			tier.Close(t.Context())
			t.Errorf("%s: accepted", tc.name)
		}
	}
}
