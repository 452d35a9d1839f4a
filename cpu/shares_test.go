package cpu

import (
	"fmt"
	"slices"
	"testing"

	"pgregory.net/rapid"

	"github.com/kvtier/kvtier/keyspace"
	"github.com/kvtier/kvtier/offload"
)

// sharesFixture is a primary with shares and the keys of each owner:
// owner 0 stores untagged keys and keys of a space no share names.
type sharesFixture struct {
	p      *Primary
	spaces []keyspace.Space // per owner; spaces[0] is the untagged space
	stray  keyspace.Space   // a space no share names: owner 0's
	quota  []int
}

func newSharesFixture(t interface{ Fatal(...any) }, slots int, quotas []int, weights []float64, policy string) *sharesFixture {
	f := &sharesFixture{spaces: []keyspace.Space{{}}, quota: []int{0}}
	var list []Share
	total := 0
	for i, q := range quotas {
		sp, err := keyspace.New(fmt.Sprintf("tenant-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		f.spaces = append(f.spaces, sp)
		f.quota = append(f.quota, q)
		list = append(list, Share{Space: sp.ID(), Slots: q, Weight: weights[i]})
		total += q
	}
	f.quota[0] = slots - total
	f.stray, _ = keyspace.New("stray")
	p, err := New(Config{SlotSize: 64, Capacity: int64(slots * 64), Policy: policy, Shares: list})
	if err != nil {
		t.Fatal(err)
	}
	f.p = p
	return f
}

func (f *sharesFixture) key(owner, id int) offload.Key {
	return f.spaces[owner].Key(fmt.Appendf(nil, "block-%d\x00\x00\x00\x00", id))
}

// ownerOf is the test's own reading of a key: by the space that made it.
func (f *sharesFixture) ownerOf(k offload.Key) int {
	for o := len(f.spaces) - 1; o > 0; o-- {
		if _, ok := f.spaces[o].Strip(k); ok {
			return o
		}
	}
	return 0
}

// held recounts each owner's slots from the primary's blocks and leases.
func (f *sharesFixture) held(leased map[int64]bool) []int {
	n := make([]int, len(f.spaces))
	keys, _ := f.p.keysWithPending()
	for _, k := range keys {
		n[f.ownerOf(k)]++
	}
	n[0] += len(leased)
	return n
}

// keysWithPending lists every key, pending ones included (test only).
func (p *Primary) keysWithPending() ([]offload.Key, int) {
	var ks []offload.Key
	for s := range p.numAllocated {
		if k := p.b.meta[s].key; k != "" {
			ks = append(ks, k)
		}
	}
	return ks, len(ks)
}

// TestSharesModel runs random stores, loads, completions, touches, leases
// and resets of several owners against a primary with shares, and checks
// after every step: the per-owner counts are exact; a store evicts only
// ready, unpinned blocks; it never takes a block of another owner at or
// under its quota, and leaves an owner it evicted at its quota or above
// (quotas hold to the block); and a refused store had nothing it could
// take.
func TestSharesModel(t *testing.T) {
	for _, policy := range []string{PolicyLRU, PolicyARC} {
		t.Run(policy, func(t *testing.T) { rapid.Check(t, func(rt *rapid.T) { sharesModel(rt, policy) }) })
	}
}

func sharesModel(rt *rapid.T, policy string) {
	slots := rapid.IntRange(4, 40).Draw(rt, "slots")
	owners := rapid.IntRange(1, 4).Draw(rt, "tenants")
	var quotas []int
	var weights []float64
	left := slots
	for i := range owners {
		q := rapid.IntRange(0, left).Draw(rt, fmt.Sprintf("quota%d", i))
		left -= q
		quotas = append(quotas, q)
		weights = append(weights, float64(rapid.IntRange(1, 4).Draw(rt, fmt.Sprintf("weight%d", i))))
	}
	f := newSharesFixture(rt, slots, quotas, weights, policy)
	p := f.p
	defer p.Close()
	pinned := map[offload.Key]int{}
	pending := map[offload.Key]bool{}
	leased := map[int64]bool{}
	idRange := rapid.IntRange(0, 2*slots)
	ownerGen := rapid.IntRange(0, owners)

	check := func(what string) {
		got := p.Shares()
		want := f.held(leased)
		for o := range want {
			if got[o].Held != want[o] {
				rt.Fatalf("%s: owner %d holds %d slots by the primary's count, %d by its keys", what, o, got[o].Held, want[o])
			}
		}
	}
	refOf := func(k offload.Key) int32 { r, _ := p.RefCount(k); return r }

	rt.Repeat(map[string]func(*rapid.T){
		"store": func(rt *rapid.T) {
			o := ownerGen.Draw(rt, "owner")
			n := rapid.IntRange(1, 6).Draw(rt, "n")
			keys := make([]offload.Key, n)
			for i := range keys {
				if o == 0 && rapid.Bool().Draw(rt, "stray") {
					keys[i] = f.stray.Key(fmt.Appendf(nil, "block-%d\x00\x00\x00\x00", idRange.Draw(rt, "id")))
					continue
				}
				keys[i] = f.key(o, idRange.Draw(rt, "id"))
			}
			before := p.Shares()
			readyBefore := map[offload.Key]int32{}
			all, _ := p.keysWithPending()
			for _, k := range all {
				readyBefore[k] = refOf(k)
			}
			out, ok := p.PrepareStore(keys)
			after := p.Shares()
			if !ok {
				for o := range before {
					if after[o].Held != before[o].Held {
						rt.Fatalf("a refused store changed owner %d's slots %d → %d", o, before[o].Held, after[o].Held)
					}
				}
				// Fewer blocks it could take than it needed: from each
				// owner above its quota the ready, unpinned blocks outside
				// the call down to the quota, and the storer's own.
				storer := f.ownerOf(keys[0])
				free := slots - len(readyBefore) - len(leased)
				fresh := map[offload.Key]bool{}
				for _, k := range keys {
					if _, had := readyBefore[k]; !had {
						fresh[k] = true
					}
				}
				takeable := make([]int, len(f.spaces))
				for k, ref := range readyBefore {
					if ref == 0 && !slices.Contains(keys, k) {
						takeable[f.ownerOf(k)]++
					}
				}
				can := 0
				for o, n := range takeable {
					switch {
					case o == storer:
						can += n
					case before[o].Held > f.quota[o]:
						can += min(n, before[o].Held-f.quota[o])
					}
				}
				if need := len(fresh) - free; can >= need {
					rt.Fatalf("store by owner %d refused: it needed %d slots and %d were takeable (%v)", storer, need, can, takeable)
				}
				return
			}
			storer := f.ownerOf(keys[0])
			lost := make([]int, len(f.spaces))
			for _, k := range out.Evicted {
				if ref, had := readyBefore[k]; !had || ref != 0 {
					rt.Fatalf("evicted %q with ref %d (present %v)", k, ref, had)
				}
				lost[f.ownerOf(k)]++
			}
			for o, l := range lost {
				if l == 0 || o == storer {
					continue
				}
				if before[o].Held <= f.quota[o] {
					rt.Fatalf("owner %d at %d of its quota %d lost %d blocks to owner %d's store", o, before[o].Held, f.quota[o], l, storer)
				}
				if after[o].Held < f.quota[o] {
					rt.Fatalf("owner %d evicted below its quota by owner %d: %d held, quota %d", o, storer, after[o].Held, f.quota[o])
				}
			}
			for _, k := range out.KeysToStore {
				pending[k] = true
			}
		},
		"complete": func(rt *rapid.T) {
			if len(pending) == 0 {
				return
			}
			ks := sortedKeys(pending)
			k := rapid.SampledFrom(ks).Draw(rt, "key")
			delete(pending, k)
			p.CompleteStore([]offload.Key{k}, rapid.IntRange(0, 3).Draw(rt, "fail") > 0)
		},
		"load": func(rt *rapid.T) {
			all, _ := p.keysWithPending()
			var ready []offload.Key
			for _, k := range all {
				if refOf(k) >= 0 {
					ready = append(ready, k)
				}
			}
			if len(ready) == 0 {
				return
			}
			k := rapid.SampledFrom(ready).Draw(rt, "key")
			if _, err := p.PrepareLoad([]offload.Key{k}); err != nil {
				rt.Fatal(err)
			}
			pinned[k]++
		},
		"unload": func(rt *rapid.T) {
			if len(pinned) == 0 {
				return
			}
			k := rapid.SampledFrom(sortedKeys(pinned)).Draw(rt, "key")
			if err := p.CompleteLoad([]offload.Key{k}); err != nil {
				rt.Fatal(err)
			}
			if pinned[k]--; pinned[k] == 0 {
				delete(pinned, k)
			}
		},
		"touch": func(rt *rapid.T) {
			o := ownerGen.Draw(rt, "owner")
			p.Touch([]offload.Key{f.key(o, idRange.Draw(rt, "id")), f.key(ownerGen.Draw(rt, "owner2"), idRange.Draw(rt, "id2"))})
		},
		"lease": func(rt *rapid.T) {
			slots, _ := p.Lease(rapid.IntRange(1, 3).Draw(rt, "n"))
			for _, s := range slots {
				leased[s] = true
			}
		},
		"bind": func(rt *rapid.T) {
			if len(leased) == 0 {
				return
			}
			ss := make([]int64, 0, len(leased))
			for s := range leased {
				ss = append(ss, s)
			}
			slices.Sort(ss)
			s := rapid.SampledFrom(ss).Draw(rt, "slot")
			delete(leased, s)
			if rapid.Bool().Draw(rt, "unlease") {
				if err := p.Unlease([]int64{s}); err != nil {
					rt.Fatal(err)
				}
				return
			}
			if _, err := p.Bind(s, f.key(ownerGen.Draw(rt, "owner"), idRange.Draw(rt, "id"))); err != nil {
				rt.Fatal(err)
			}
		},
		"reset": func(rt *rapid.T) {
			if rapid.IntRange(0, 9).Draw(rt, "rarely") == 0 {
				p.Reset()
			}
		},
		"": func(rt *rapid.T) { check("after the step") },
	})
}

func sortedKeys[V any](m map[offload.Key]V) []offload.Key {
	ks := make([]offload.Key, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// TestSharesConfigErrors: quotas beyond the primary and bad shares are
// errors, not a primary that cannot keep its promises.
func TestSharesConfigErrors(t *testing.T) {
	sp, _ := keyspace.New("a")
	for _, tc := range []struct {
		name   string
		shares []Share
	}{
		{"quotas beyond the slots", []Share{{Space: sp.ID(), Slots: 11}}},
		{"negative quota", []Share{{Space: sp.ID(), Slots: -1}}},
		{"space 0", []Share{{Space: 0, Slots: 1}}},
		{"negative weight", []Share{{Space: sp.ID(), Slots: 1, Weight: -1}}},
		{"space twice", []Share{{Space: sp.ID(), Slots: 1}, {Space: sp.ID(), Slots: 1}}},
	} {
		if _, err := New(Config{SlotSize: 8, Capacity: 80, Shares: tc.shares}); err == nil {
			t.Errorf("%s: accepted", tc.name)
		}
	}
}

// TestSharesFloodKeepsQuota: a tenant flooding stores takes the idle
// share, but not the quota another tenant fills.
func TestSharesFloodKeepsQuota(t *testing.T) {
	f := newSharesFixture(t, 100, []int{40, 40}, []float64{1, 1}, PolicyLRU)
	defer f.p.Close()
	store := func(o, id int) {
		k := f.key(o, id)
		out, ok := f.p.PrepareStore([]offload.Key{k})
		if !ok {
			t.Fatalf("store of owner %d refused", o)
		}
		f.p.CompleteStore(out.KeysToStore, true)
	}
	for i := range 40 {
		store(1, i)
	}
	for i := range 1000 {
		store(2, i)
	}
	sh := f.p.Shares()
	if sh[1].Held != 40 || sh[2].Held != 60 {
		t.Fatalf("after a flood by tenant 2: tenant 1 holds %d (quota 40), tenant 2 %d (want 60: its quota and the idle pool)", sh[1].Held, sh[2].Held)
	}
	if sh[1].EvictedByOthers != 0 {
		t.Fatalf("tenant 1 lost %d blocks to the flood", sh[1].EvictedByOthers)
	}
	// Tenant 1 grows again: it takes back what tenant 2 borrowed beyond
	// its quota until the two are equally far above their quotas (equal
	// weights share the idle pool equally), and no further.
	for i := 40; i < 200; i++ {
		store(1, i)
	}
	sh = f.p.Shares()
	if sh[1].Held != 50 || sh[2].Held != 50 {
		t.Fatalf("tenant 1 growing: tenant 1 holds %d, tenant 2 %d; want 50 and 50", sh[1].Held, sh[2].Held)
	}
}

// TestSharesWeights: the idle pool goes to the tenants using it in
// proportion to their weights.
func TestSharesWeights(t *testing.T) {
	f := newSharesFixture(t, 100, []int{40, 40}, []float64{3, 1}, PolicyLRU)
	defer f.p.Close()
	for i := range 400 {
		for o := 1; o <= 2; o++ {
			out, ok := f.p.PrepareStore([]offload.Key{f.key(o, i)})
			if !ok {
				t.Fatalf("store of owner %d refused", o)
			}
			f.p.CompleteStore(out.KeysToStore, true)
		}
	}
	sh := f.p.Shares()
	// 15 and 5 above the quotas, to the block: ties alternate.
	if d := sh[1].Held - 55; d < -1 || d > 1 || sh[1].Held+sh[2].Held != 100 {
		t.Fatalf("weights 3:1 over quotas 40/40 and a pool of 20: held %d and %d, want 55 and 45 (±1)", sh[1].Held, sh[2].Held)
	}
}
