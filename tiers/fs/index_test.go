package fs

import (
	"slices"
	"testing"

	"pgregory.net/rapid"

	"github.com/kvtier/kvtier/offload"
)

// TestIndexModel checks the index against a simple model under random
// operations: LRU order, byte accounting, readers never evicted, doomed
// slots kept until their last reader is done.
func TestIndexModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		x := newIndex()
		type mstate struct {
			size     int64
			evicting bool
		}
		mapped := map[offload.Key]*mstate{}
		var order []offload.Key // live keys, most recently used first
		type handle struct {
			i   int32
			key offload.Key
		}
		var handles []handle
		readers := map[offload.Key]int{} // readers of the mapped entry of key
		kept := map[offload.Key]bool{}   // pinned by routers: never a victim
		x.keep = func(k offload.Key) bool { return kept[k] }
		var evicting []int32

		keyGen := rapid.Map(rapid.IntRange(0, 15), func(n int) offload.Key { return k(n) })
		remove := func(s []offload.Key, key offload.Key) []offload.Key {
			return slices.DeleteFunc(s, func(o offload.Key) bool { return o == key })
		}
		check := func() {
			var used int64
			for _, m := range mapped {
				used += m.size
			}
			if x.used != used {
				t.Fatalf("used %d, model %d", x.used, used)
			}
			var got []offload.Key
			for i := x.heads[0]; i != nilIdx; i = x.ents[i].next {
				got = append(got, x.ents[i].key)
			}
			if !slices.Equal(got, order) {
				t.Fatalf("LRU order %v, model %v", got, order)
			}
			if x.live != len(order) || len(x.byKey) != len(mapped) {
				t.Fatalf("live %d map %d, model %d %d", x.live, len(x.byKey), len(order), len(mapped))
			}
		}
		t.Repeat(map[string]func(*rapid.T){
			"insert": func(t *rapid.T) {
				key := keyGen.Draw(t, "key")
				if _, ok := mapped[key]; ok {
					t.Skip("mapped")
				}
				size := int64(rapid.IntRange(1, 100).Draw(t, "size"))
				x.insert(key, size)
				mapped[key] = &mstate{size: size}
				order = append([]offload.Key{key}, order...)
				readers[key] = 0
			},
			"touch": func(t *rapid.T) {
				key := keyGen.Draw(t, "key")
				i, ok := x.find(key)
				if !ok {
					t.Skip("absent")
				}
				x.touch(i)
				if !mapped[key].evicting {
					order = append([]offload.Key{key}, remove(order, key)...)
				}
			},
			"acquire": func(t *rapid.T) {
				key := keyGen.Draw(t, "key")
				i, ok := x.acquire(key)
				m := mapped[key]
				want := m != nil && !m.evicting
				if ok != want {
					t.Fatalf("acquire %v = %v, want %v", key, ok, want)
				}
				if ok {
					handles = append(handles, handle{i, key})
					readers[key]++
				}
			},
			"done": func(t *rapid.T) {
				if len(handles) == 0 {
					t.Skip("no readers")
				}
				n := rapid.IntRange(0, len(handles)-1).Draw(t, "handle")
				h := handles[n]
				handles = slices.Delete(handles, n, n+1)
				x.done(h.i)
				if j, ok := x.find(h.key); ok && j == h.i {
					readers[h.key]--
				}
			},
			"keep": func(t *rapid.T) { // a router pins or unpins a key
				key := keyGen.Draw(t, "key")
				kept[key] = !kept[key]
			},
			"drop": func(t *rapid.T) { // a corrupt file
				key := keyGen.Draw(t, "key")
				i, ok := x.find(key)
				if !ok || mapped[key].evicting {
					t.Skip("not live")
				}
				x.drop(i)
				delete(mapped, key)
				order = remove(order, key)
				readers[key] = 0
			},
			"evict": func(t *rapid.T) {
				if len(evicting) > 0 {
					t.Skip("eviction in progress")
				}
				need := int64(rapid.IntRange(1, 300).Draw(t, "need"))
				victims, freed := x.pickVictims(need, 0)
				var want []offload.Key
				var wantFreed int64
				for j := len(order) - 1; j >= 0 && wantFreed < need; j-- {
					if readers[order[j]] == 0 && !kept[order[j]] {
						want = append(want, order[j])
						wantFreed += mapped[order[j]].size
					}
				}
				var got []offload.Key
				for _, i := range victims {
					got = append(got, x.ents[i].key)
				}
				if !slices.Equal(got, want) || freed != wantFreed {
					t.Fatalf("victims %v (%d bytes), model %v (%d)", got, freed, want, wantFreed)
				}
				for _, key := range want {
					mapped[key].evicting = true
					order = remove(order, key)
				}
				evicting = victims
			},
			"finish eviction": func(t *rapid.T) {
				if len(evicting) == 0 {
					t.Skip("none")
				}
				keepMask := rapid.SliceOfN(rapid.Bool(), len(evicting), len(evicting)).Draw(t, "unlink fails")
				for n, i := range evicting {
					key := x.ents[i].key
					if keepMask[n] {
						x.unevict(i)
						mapped[key].evicting = false
						order = append(order, key)
					} else {
						x.drop(i)
						delete(mapped, key)
					}
				}
				evicting = nil
			},
			"": func(*rapid.T) { check() },
		})
	})
}
