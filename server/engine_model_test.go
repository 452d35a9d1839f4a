package server

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"testing"

	"pgregory.net/rapid"

	kvtierv1 "github.com/kvtier/kvtier/api/kvtier/v1"
	"github.com/kvtier/kvtier/keyspace"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/tiering"
)

// The model-based test of manager mode drives one namespace's EngineStep
// with random interleavings of several engines — requests, lookups (a HIT
// is a lookup lease), stores into leased slots written through the arena
// (some failed, some bound to keys another engine stored meanwhile),
// unpins, finishes, returned slots, Resets and engine deaths — and checks
// after every step:
//
//   - no lease loses its block: every slot a HIT named still holds its
//     key's bytes until the engine unpins it (no eviction raced it);
//   - the primary's leased and pinned slots are exactly the live engines'
//     free leases and lookup leases;
//   - when every engine has ended, nothing is leased or pinned.

type modelEngine struct {
	s     *session
	pool  []int64                 // free leased slots
	reqs  map[string]bool         // request id -> finished
	hits  map[string][]modelLease // request id -> lookup leases held
	alive bool
}

type modelLease struct {
	k    offload.Key
	slot int64
}

func TestEngineLeasesModel(t *testing.T) {
	counts := map[string]int{}
	defer func() { t.Logf("over all runs: %v", counts) }()
	rapid.Check(t, func(rt *rapid.T) {
		const slotSize, slots, numKeys = 64, 12, 16
		ns, p, m := modelNamespace(rt, slotSize, slots, 0, tiering.BudgetConfig{})
		defer ns.Close(context.Background())
		arena := p.Arena()
		universe := make([]offload.Key, numKeys)
		for i := range universe {
			universe[i] = offload.MakeKey([]byte(fmt.Sprintf("key-%03d", i)), 0)
		}
		var engines []*modelEngine
		stored := map[offload.Key]bool{} // keys stored at some point (a hint for lookups)
		nextSess := uint64(0)
		nextReq := 0
		live := func() []*modelEngine {
			var out []*modelEngine
			for _, e := range engines {
				if e.alive {
					out = append(out, e)
				}
			}
			return out
		}
		pick := func(rt *rapid.T) *modelEngine {
			l := live()
			if len(l) == 0 {
				rt.Skip("no engine")
			}
			return rapid.SampledFrom(l).Draw(rt, "engine")
		}
		openReq := func(rt *rapid.T, e *modelEngine) string {
			var ids []string
			for id, fin := range e.reqs {
				if !fin {
					ids = append(ids, id)
				}
			}
			if len(ids) == 0 {
				rt.Skip("no open request")
			}
			slices.Sort(ids)
			return rapid.SampledFrom(ids).Draw(rt, "req")
		}
		step := func(rt *rapid.T, e *modelEngine, in *kvtierv1.EngineStepRequest) *kvtierv1.EngineStepResponse {
			out, err := ns.EngineStep(e.s, in, keyspace.Space{})
			if err != nil {
				rt.Fatalf("step: %v", err)
			}
			e.pool = append(e.pool, out.GetGrantedSlots()...)
			return out
		}
		packOf := func(keys []offload.Key) ([]byte, uint32) {
			var b []byte
			for _, k := range keys {
				b = append(b, k...)
			}
			return b, uint32(len(keys[0]))
		}

		rt.Repeat(map[string]func(*rapid.T){
			"attach": func(rt *rapid.T) {
				if len(live()) >= 3 {
					rt.Skip("enough engines")
				}
				nextSess++
				e := &modelEngine{s: &session{id: nextSess}, reqs: map[string]bool{}, hits: map[string][]modelLease{}, alive: true}
				engines = append(engines, e)
				step(rt, e, &kvtierv1.EngineStepRequest{WantFreeSlots: uint32(rapid.IntRange(1, 6).Draw(rt, "want"))})
			},
			"newRequest": func(rt *rapid.T) {
				e := pick(rt)
				nextReq++
				id := fmt.Sprint("r", nextReq%4) // ids repeat across engines
				if _, ok := e.reqs[id]; ok {
					rt.Skip("id in use")
				}
				out := step(rt, e, &kvtierv1.EngineStepRequest{NewRequests: []*kvtierv1.EngineNewRequest{{RequestId: id}},
					WantFreeSlots: uint32(len(e.pool) + rapid.IntRange(0, 3).Draw(rt, "more"))})
				if len(out.GetWarnings()) > 0 {
					rt.Fatalf("new request: %v", out.GetWarnings())
				}
				e.reqs[id] = false
			},
			"store": func(rt *rapid.T) {
				e := pick(rt)
				id := openReq(rt, e)
				if len(e.pool) == 0 {
					rt.Skip("no leased slot")
				}
				n := rapid.IntRange(1, min(3, len(e.pool))).Draw(rt, "n")
				a := rapid.IntRange(0, numKeys-n).Draw(rt, "first")
				keys := universe[a : a+n]
				sl := e.pool[:n:n]
				e.pool = e.pool[n:]
				ok := rapid.IntRange(0, 4).Draw(rt, "ok") > 0
				for i, k := range keys {
					b, _ := arena.Slot(sl[i])
					copy(b, blockContent(k, slotSize))
				}
				pk, size := packOf(keys)
				out := step(rt, e, &kvtierv1.EngineStepRequest{
					Stores:        []*kvtierv1.EngineStore{{RequestId: id, PackedKeys: pk, KeySize: size, Slots: sl, Success: ok}},
					WantFreeSlots: uint32(rapid.IntRange(0, 4).Draw(rt, "want")),
				})
				if len(out.GetWarnings()) > 0 {
					rt.Fatalf("store: %v", out.GetWarnings())
				}
				if ok {
					for _, k := range keys {
						stored[k] = true
					}
				}
				counts["stores"]++
			},
			"lookup": func(rt *rapid.T) {
				e := pick(rt)
				id := openReq(rt, e)
				n := rapid.IntRange(1, 4).Draw(rt, "n")
				a := rapid.IntRange(0, numKeys-n).Draw(rt, "first")
				keys := universe[a : a+n]
				if len(stored) > 0 && rapid.IntRange(0, 3).Draw(rt, "ofStored") > 0 {
					var ks []offload.Key
					for _, k := range universe {
						if stored[k] {
							ks = append(ks, k)
						}
					}
					keys = ks[:rapid.IntRange(1, min(4, len(ks))).Draw(rt, "m")]
				}
				pk, size := packOf(keys)
				out := step(rt, e, &kvtierv1.EngineStepRequest{Lookups: []*kvtierv1.EngineKeys{{RequestId: id, PackedKeys: pk, KeySize: size}}})
				res := out.GetLookups()[0]
				j := 0
				for i, f := range res.GetFound() {
					if f != byte(kvtierv1.RegionFound_REGION_FOUND_HIT) {
						continue
					}
					slot := res.GetSlots()[j]
					j++
					b, _ := arena.Slot(slot)
					if !bytes.Equal(b, blockContent(keys[i], slotSize)) {
						rt.Fatalf("HIT %v names slot %d holding other bytes", keys[i], slot)
					}
					e.hits[id] = append(e.hits[id], modelLease{keys[i], slot})
					counts["hits"]++
				}
			},
			"unpin": func(rt *rapid.T) {
				e := pick(rt)
				var ids []string
				for id, hs := range e.hits {
					if len(hs) > 0 {
						ids = append(ids, id)
					}
				}
				if len(ids) == 0 {
					rt.Skip("no lease")
				}
				slices.Sort(ids)
				id := rapid.SampledFrom(ids).Draw(rt, "req")
				h := e.hits[id][0]
				e.hits[id] = e.hits[id][1:]
				pk, size := packOf([]offload.Key{h.k})
				out := step(rt, e, &kvtierv1.EngineStepRequest{Unpins: []*kvtierv1.EngineKeys{{RequestId: id, PackedKeys: pk, KeySize: size}}})
				if len(out.GetWarnings()) > 0 {
					rt.Fatalf("unpin: %v", out.GetWarnings())
				}
			},
			"finish": func(rt *rapid.T) {
				e := pick(rt)
				id := openReq(rt, e)
				step(rt, e, &kvtierv1.EngineStepRequest{FinishedRequestIds: []string{id}})
				e.reqs[id] = true
			},
			"return": func(rt *rapid.T) {
				e := pick(rt)
				if len(e.pool) == 0 {
					rt.Skip("no slot")
				}
				step(rt, e, &kvtierv1.EngineStepRequest{ReturnSlots: e.pool[:1]})
				e.pool = e.pool[1:]
			},
			"reset": func(rt *rapid.T) {
				if rapid.IntRange(0, 3).Draw(rt, "rare") > 0 {
					rt.Skip("rare")
				}
				step(rt, pick(rt), &kvtierv1.EngineStepRequest{ResetCache: true})
				counts["resets"]++
			},
			"die": func(rt *rapid.T) {
				if rapid.IntRange(0, 4).Draw(rt, "rare") > 0 {
					rt.Skip("rare")
				}
				e := pick(rt)
				e.s.closed.Store(true)
				ns.releaseSession(e.s)
				e.alive = false
				counts["deaths"]++
			},
			"": func(rt *rapid.T) {
				leased, pinned := 0, 0
				for _, e := range live() {
					leased += len(e.pool)
					for _, hs := range e.hits {
						pinned += len(hs)
						for _, h := range hs {
							b, _ := arena.Slot(h.slot)
							if !bytes.Equal(b, blockContent(h.k, slotSize)) {
								rt.Fatalf("lease of %v: slot %d was reused under it", h.k, h.slot)
							}
						}
					}
				}
				st := p.Stats()
				if st.Leased != leased {
					rt.Fatalf("primary leases %d slots, the engines hold %d", st.Leased, leased)
				}
				// Cascades pin too; with none in flight the pins are the leases.
				if m.Stats().JobsInFlight == 0 {
					refs := 0
					for _, k := range universe {
						if r, ok := p.RefCount(k); ok && r > 0 {
							refs += int(r)
						}
					}
					if refs != pinned {
						rt.Fatalf("primary pins %d, the engines hold %d lookup leases", refs, pinned)
					}
				}
			},
		})
		for _, e := range live() {
			e.s.closed.Store(true)
			ns.releaseSession(e.s)
		}
		for i := 0; i < 50 && m.HasPendingWork(); i++ {
			ns.ScheduleEnd(offload.ScheduleEnd{})
		}
		if st := p.Stats(); st.Leased != 0 || st.Pinned != 0 || st.Pending != 0 || len(ns.leases) != 0 {
			rt.Fatalf("after every engine ended: %+v, %d sessions with leases", st, len(ns.leases))
		}
	})
}
