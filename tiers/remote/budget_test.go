package remote

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/kvtier/kvtier/keyspace"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/quota"
)

// TestBudgetModel drives a Budget with random store jobs (admitted,
// their victims deleted from a model server, then settled with random
// outcomes, several in flight at once), reads, removals by the server and
// listings, and checks after each step: the ledger never exceeds
// max_bytes; it holds every block the model server holds (it never
// undercounts); a victim is never a block being written; an owner other
// than the storer loses a block only while it is above its quota, and
// then not below its quota by a block or more; a refused job takes
// nothing; and at the end every admission is settled with nothing left
// being written.
func TestBudgetModel(t *testing.T) {
	const size = 4
	rapid.Check(t, func(rt *rapid.T) {
		nTenants := rapid.IntRange(0, 3).Draw(rt, "tenants")
		capBlocks := rapid.IntRange(1, 10).Draw(rt, "capacity")
		maxBytes := int64(capBlocks*size + rapid.IntRange(0, size-1).Draw(rt, "odd"))
		spaces := make([]keyspace.Space, nTenants)
		var list []quota.Share
		left := maxBytes
		for i := range spaces {
			spaces[i], _ = keyspace.Tenant(fmt.Sprint("t", i))
			q := rapid.Int64Range(0, left).Draw(rt, fmt.Sprint("quota", i))
			left -= q
			list = append(list, quota.Share{Space: spaces[i].ID(), Quota: q, Weight: rapid.SampledFrom([]float64{0, 1, 2}).Draw(rt, "weight")})
		}
		b, err := NewBudget(maxBytes, list)
		if err != nil {
			rt.Fatal(err)
		}
		quotaOf := func(o int) int64 {
			if o == 0 {
				return left
			}
			return list[o-1].Quota
		}
		keyOf := func(o, n int) offload.Key {
			raw := offload.MakeKey(fmt.Appendf(nil, "%d/%d", o, n), 0)
			if o == 0 {
				return raw
			}
			return spaces[o-1].Key([]byte(raw))
		}
		ownerOf := map[offload.Key]int{}
		server := map[offload.Key]bool{} // what the model server holds
		writing := map[offload.Key]int{}
		type pending struct {
			a    *Admission
			keys []offload.Key
		}
		var inflight []pending

		heldBy := func() []int64 {
			h := make([]int64, nTenants+1)
			for k, e := range b.ents {
				if e.size != size || int(e.owner) != ownerOf[k] {
					rt.Fatalf("entry %v: size %d owner %d", k, e.size, e.owner)
				}
				h[e.owner] += e.size
			}
			return h
		}
		check := func() {
			var total int64
			h := heldBy()
			for o, v := range h {
				if v != b.held[o] {
					rt.Fatalf("owner %d: held %d, entries %d", o, b.held[o], v)
				}
				total += v
			}
			if total > maxBytes {
				rt.Fatalf("ledger %d bytes > max %d", total, maxBytes)
			}
			for k := range server {
				if b.ents[k] == nil {
					rt.Fatalf("server holds %v, the ledger does not", k)
				}
			}
			n := 0
			for o := range b.lru {
				for e := b.lru[o].next; e != &b.lru[o]; e = e.next {
					if b.ents[e.key] != e || int(e.owner) != o {
						rt.Fatalf("list %d holds a stray entry", o)
					}
					n++
				}
			}
			if n != len(b.ents) {
				rt.Fatalf("lists hold %d entries, map %d", n, len(b.ents))
			}
		}

		rt.Repeat(map[string]func(*rapid.T){
			"admit": func(rt *rapid.T) {
				o := rapid.IntRange(0, nTenants).Draw(rt, "owner")
				var keys []offload.Key
				for range rapid.IntRange(1, 4).Draw(rt, "n") {
					k := keyOf(o, rapid.IntRange(0, 12).Draw(rt, "key"))
					ownerOf[k] = o
					keys = append(keys, k)
				}
				before := heldBy()
				entsBefore := len(b.ents)
				a, victims, err := b.Admit(keys, size)
				if errors.Is(err, ErrFull) {
					if len(b.ents) != entsBefore {
						rt.Fatalf("a refused job changed the ledger")
					}
					for i, h := range heldBy() {
						if h != before[i] {
							rt.Fatalf("a refused job changed owner %d's bytes", i)
						}
					}
					return
				}
				if err != nil {
					rt.Fatal(err)
				}
				after := heldBy()
				lost := map[int]bool{}
				for _, v := range victims {
					if writing[v] > 0 {
						rt.Fatalf("victim %v is being written", v)
					}
					delete(server, v)
					lost[ownerOf[v]] = true
				}
				for vo := range lost {
					if vo == o {
						continue
					}
					if before[vo] <= quotaOf(vo) || after[vo] <= quotaOf(vo)-size {
						rt.Fatalf("owner %d (quota %d) went %d → %d for owner %d's store", vo, quotaOf(vo), before[vo], after[vo], o)
					}
				}
				for _, k := range keys {
					writing[k]++
				}
				inflight = append(inflight, pending{a, keys})
			},
			"settle": func(rt *rapid.T) {
				if len(inflight) == 0 {
					rt.Skip("nothing in flight")
				}
				i := rapid.IntRange(0, len(inflight)-1).Draw(rt, "job")
				p := inflight[i]
				inflight = append(inflight[:i], inflight[i+1:]...)
				written := make([]bool, len(p.keys))
				for j := range written {
					written[j] = rapid.Bool().Draw(rt, "written")
					if written[j] {
						server[p.keys[j]] = true
					}
				}
				b.Settle(p.a, func(j int) bool { return written[j] })
				for _, k := range p.keys {
					writing[k]--
				}
			},
			"touch": func(rt *rapid.T) {
				o := rapid.IntRange(0, nTenants).Draw(rt, "owner")
				b.Touch([]offload.Key{keyOf(o, rapid.IntRange(0, 12).Draw(rt, "key"))})
			},
			"server drops": func(rt *rapid.T) {
				o := rapid.IntRange(0, nTenants).Draw(rt, "owner")
				k := keyOf(o, rapid.IntRange(0, 12).Draw(rt, "key"))
				if writing[k] > 0 {
					return // the write in flight may land after the drop
				}
				delete(server, k)
				b.Forget([]offload.Key{k})
			},
			"": func(rt *rapid.T) { check() },
		})
		for _, p := range inflight {
			b.Settle(p.a, func(int) bool { return true })
		}
		for k, e := range b.ents {
			if e.writing != 0 {
				rt.Fatalf("%v still being written after every job settled", k)
			}
		}
		check()
	})
}

// TestBudgetListing: blocks found on the server enter as their owners'
// oldest, and Trim deletes down to max_bytes from owners above their
// quotas only.
func TestBudgetListing(t *testing.T) {
	a, _ := keyspace.Tenant("a")
	bs, _ := keyspace.Tenant("b")
	b, err := NewBudget(40, []quota.Share{{Space: a.ID(), Quota: 20}, {Space: bs.ID(), Quota: 20}})
	if err != nil {
		t.Fatal(err)
	}
	key := func(s keyspace.Space, n int) offload.Key {
		return s.Key([]byte(offload.MakeKey(fmt.Appendf(nil, "%d", n), 0)))
	}
	for i := range 3 {
		b.Add(key(a, i), 10) // 30 of a's 20
	}
	b.Add(key(bs, 0), 10)
	b.Add(key(bs, 0), 10) // listed twice: counted once
	b.Add(key(bs, 1), 10)
	if st := b.Stats(); st.Bytes != 50 || st.Blocks != 5 {
		t.Fatalf("after the listing: %+v", st)
	}
	v := b.Trim()
	if len(v) != 1 {
		t.Fatalf("Trim took %v, want one block", v)
	}
	if id, _ := keyspace.IDOf(v[0]); id != a.ID() {
		t.Fatalf("Trim took %v, want one of a's", v)
	}
	if st := b.Stats(); st.Bytes != 40 || st.Evicted != 1 {
		t.Fatalf("after Trim: %+v", st)
	}
	// b within its quota: a's store evicts a's own blocks.
	_, v, err = b.Admit([]offload.Key{key(a, 9)}, 10)
	if err != nil || len(v) != 1 {
		t.Fatalf("Admit: victims %v, %v", v, err)
	}
	if id, _ := keyspace.IDOf(v[0]); id != a.ID() {
		t.Fatalf("Admit took %v, want one of a's", v)
	}
	if _, err := NewBudget(10, []quota.Share{{Space: a.ID(), Quota: 20}}); !errors.Is(err, quota.ErrOverCommitted) {
		t.Fatalf("over-committed quotas: %v", err)
	}
	if _, err := NewBudget(0, nil); err == nil {
		t.Fatal("max_bytes 0 accepted")
	}
}

// A victim whose deletion fails stays counted, as the newest: the store
// that needed it fails without writing, and the next store takes another
// victim instead of failing on the same one again (its node may be down).
func TestBaseBudgetDeleteFails(t *testing.T) {
	f := &fakeBackend{blocks: map[offload.Key]byte{}, bad: map[offload.Key]bool{}}
	h := NewHealth("t", func(context.Context) error { return nil }, HealthOptions{Threshold: 1, Interval: time.Hour, Logger: slog.New(slog.DiscardHandler)})
	undeletable := offload.Key("key-x")
	del := func(_ context.Context, keys []offload.Key) ([]offload.Key, error) {
		f.mu.Lock()
		defer f.mu.Unlock()
		var failed []offload.Key
		for _, k := range keys {
			if k == undeletable {
				failed = append(failed, k)
				continue
			}
			delete(f.blocks, k)
		}
		if failed != nil {
			return failed, errors.New("node down")
		}
		return nil, nil
	}
	arena := &memArena{slots: [][]byte{{1}, {2}, {3}}}
	size := int64(HeaderSize + 1)
	budget, err := NewBudget(2*size, nil)
	if err != nil {
		t.Fatal(err)
	}
	ev := NewEvents("t", offload.MediumCPU, offload.LocalityRemote, 0)
	b := NewBase(BaseConfig{
		Name: "t", Label: `test tier "t"`, Medium: offload.MediumCPU, Locality: offload.LocalityRemote,
		Health: h, Counters: new(Counters), Events: ev, MaxInflight: 8,
		Exists: f.exists, Logger: slog.New(slog.DiscardHandler),
		Store: f.store, Load: f.load, Budget: budget, Delete: del,
	})
	defer b.Close(context.Background())
	store := func(id uint64, k offload.Key, slot int64) offload.JobResult {
		b.SubmitStore(&offload.Job{ID: id, Keys: []offload.Key{k}, Slots: []int64{slot}, Arena: arena})
		return results(t, b, 1)[id]
	}
	if r := store(1, undeletable, 0); !r.Success {
		t.Fatal(r.Err)
	}
	if r := store(2, "key-y", 1); !r.Success {
		t.Fatal(r.Err)
	}
	// key-z needs room: the oldest, key-x, cannot be deleted.
	if r := store(3, "key-z", 2); r.Success {
		t.Fatal("a store whose victim could not be deleted succeeded")
	}
	if _, ok := f.blocks["key-z"]; ok {
		t.Fatal("a store without room wrote its block")
	}
	if st := budget.Stats(); st.Blocks != 2 || st.Bytes != 2*size {
		t.Fatalf("ledger after the failed delete: %+v", st)
	}
	// Again: key-x is now the newest, so key-y goes.
	if r := store(4, "key-z", 2); !r.Success {
		t.Fatalf("the next store: %v", r.Err)
	}
	if _, ok := f.blocks["key-y"]; ok || len(f.blocks) != 2 {
		t.Fatalf("server holds %v, want key-x and key-z", f.blocks)
	}
	var removed []offload.Key
	for _, e := range b.TakeEvents() {
		if e.Removed {
			removed = append(removed, e.Keys...)
		}
	}
	if len(removed) != 1 || removed[0] != "key-y" {
		t.Fatalf("removed events %v, want key-y only", removed)
	}
}

// BenchmarkBudgetAdmit: a store job of 16 new blocks into a full ledger
// of 4 096 (each block evicting one), admitted and settled — the
// bookkeeping max_bytes adds to a job whose I/O moves 16 blocks. Without
// tenants, and with two tenants' shares.
func BenchmarkBudgetAdmit(b *testing.B) {
	const n, job = 4096, 16
	ta, _ := keyspace.Tenant("a")
	tb, _ := keyspace.Tenant("b")
	for _, c := range []struct {
		name   string
		shares []quota.Share
	}{{"pool", nil}, {"shares", []quota.Share{{Space: ta.ID(), Quota: n / 2}, {Space: tb.ID(), Quota: n / 4}}}} {
		b.Run(c.name, func(b *testing.B) {
			bud, err := NewBudget(n, c.shares)
			if err != nil {
				b.Fatal(err)
			}
			keyOf := func(i int) offload.Key {
				s := ta
				if i%2 == 1 {
					s = tb
				}
				return s.Key(fmt.Appendf(nil, "block-%08d", i))
			}
			next := 0
			batch := func() []offload.Key {
				ks := make([]offload.Key, job)
				for i := range ks {
					ks[i] = keyOf(next)
					next++
				}
				return ks
			}
			for range n / job { // fill
				a, _, _ := bud.Admit(batch(), 1)
				bud.Settle(a, func(int) bool { return true })
			}
			jobs := make([][]offload.Key, 256)
			for i := range jobs {
				jobs[i] = batch()
			}
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				ks := jobs[i%len(jobs)]
				if i%len(jobs) == 0 && i > 0 { // keys already held would not evict
					b.StopTimer()
					for j := range jobs {
						jobs[j] = batch()
					}
					ks = jobs[0]
					b.StartTimer()
				}
				a, victims, err := bud.Admit(ks, 1)
				if err != nil || len(victims) != job {
					b.Fatalf("admit: %d victims, %v", len(victims), err)
				}
				bud.Settle(a, func(int) bool { return true })
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*job), "ns/block")
		})
	}
}

// A kept block (a router's pin: offload.Keeper) is never a victim: the
// store takes the next oldest, and fails with ErrFull when only kept
// blocks are left.
func TestBudgetPassesOverKeptBlocks(t *testing.T) {
	b, err := NewBudget(20, nil)
	if err != nil {
		t.Fatal(err)
	}
	k := func(n int) offload.Key { return offload.MakeKey(fmt.Appendf(nil, "%d", n), 0) }
	kept := map[offload.Key]bool{k(0): true}
	b.Keep(func(key offload.Key) bool { return kept[key] })
	// A listing enters each block as the oldest so far: k0 is the oldest.
	b.Add(k(1), 10)
	b.Add(k(0), 10)
	a, victims, err := b.Admit([]offload.Key{k(2)}, 10)
	if err != nil || len(victims) != 1 || victims[0] != k(1) {
		t.Fatalf("victims %v, err %v: want k1, the oldest block not kept", victims, err)
	}
	b.Settle(a, func(int) bool { return true })
	kept[k(2)] = true
	if _, victims, err := b.Admit([]offload.Key{k(3)}, 10); !errors.Is(err, ErrFull) {
		t.Fatalf("victims %v, err %v: want ErrFull, every block kept", victims, err)
	}
	delete(kept, k(0))
	if _, victims, err := b.Admit([]offload.Key{k(3)}, 10); err != nil || len(victims) != 1 || victims[0] != k(0) {
		t.Fatalf("victims %v, err %v: want k0 once it is no longer kept", victims, err)
	}
}
