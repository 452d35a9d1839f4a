package server

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/kvtier/kvtier/cpu"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/tiering"
	"github.com/kvtier/kvtier/tiers/memory"
)

// The model-based test of sessions drives one namespace with random
// interleavings of several client sessions — requests, stores written
// straight into the arena (some late, after another session's Reset),
// loads, finishes, Resets, crashes (a session ending with everything it
// holds), idle expiry, engine steps and tier completions — and checks
// after every action:
//
//   - no read ever returns bytes other than those stored for its key: every
//     block a session loads, and every ready block in the primary, holds
//     its key's content (contamination through a reused slot would show);
//   - every pin and reservation is accounted for: the primary's pinned and
//     pending blocks are exactly the live sessions' pins and reservations
//     plus the tiers' jobs in flight;
//   - nothing is left once every session has ended and the tiers are idle:
//     no request, no pin, no pending slot.

var sessSeed = maphash.MakeSeed()

// blockContent is key k's content: a key names its content (it hashes the
// tokens), so any other bytes under k are a wrong read.
func blockContent(k offload.Key, size int) []byte {
	b := make([]byte, size)
	for i := 0; i < size; i += 8 {
		binary.LittleEndian.PutUint64(b[i:], maphash.String(sessSeed, fmt.Sprint(string(k), i)))
	}
	return b
}

type modelSession struct {
	s     *session
	reqs  []*modelReq
	alive bool
}

type modelReq struct {
	id       string
	finished bool
	pins     []offload.Key // loads not completed
	resv     []reservation // stores not completed
}

type reservation struct {
	keys    []offload.Key
	slots   []int64
	written bool
}

// modelSessionRequests is the session model's Limits.MaxSessionRequests.
const modelSessionRequests = 2

func TestSessionsModel(t *testing.T) {
	counts := map[string]int{}
	defer func() { t.Logf("over all runs: %v", counts) }()
	rapid.Check(t, func(rt *rapid.T) {
		const slotSize, slots, numKeys = 64, 8, 14
		ns, p, m := modelNamespace(rt, slotSize, slots, 10, tiering.BudgetConfig{Fraction: 0.5})
		defer ns.Close(context.Background())
		// Two requests per session: the model reaches the cap (its ids
		// repeat over three names per session).
		ns.limits.MaxSessionRequests = modelSessionRequests
		arena := p.Arena()
		universe := make([]offload.Key, numKeys)
		for i := range universe {
			universe[i] = offload.MakeKey([]byte(fmt.Sprint("k", i)), 0)
		}
		var sessions []*modelSession
		nextSess, nextReq := uint64(0), 0

		verifySlots := func(keys []offload.Key, sl []int64, what string) {
			for i, k := range keys {
				b, err := arena.Slot(sl[i])
				if err != nil {
					rt.Fatal(err)
				}
				if !bytes.Equal(b, blockContent(k, slotSize)) {
					rt.Fatalf("%s: %v holds another block's bytes", what, k)
				}
			}
		}
		live := func() []*modelSession {
			var out []*modelSession
			for _, s := range sessions {
				if s.alive {
					out = append(out, s)
				}
			}
			return out
		}
		pickSess := func(rt *rapid.T) *modelSession {
			l := live()
			if len(l) == 0 {
				rt.Skip("no session")
			}
			return rapid.SampledFrom(l).Draw(rt, "session")
		}
		pickReq := func(rt *rapid.T, s *modelSession, open bool) *modelReq {
			var c []*modelReq
			for _, r := range s.reqs {
				if !open || !r.finished {
					c = append(c, r)
				}
			}
			if len(c) == 0 {
				rt.Skip("no request")
			}
			return rapid.SampledFrom(c).Draw(rt, "req")
		}
		drop := func(s *modelSession, r *modelReq) {
			if r.finished && len(r.pins) == 0 && len(r.resv) == 0 {
				s.reqs = slices.DeleteFunc(s.reqs, func(x *modelReq) bool { return x == r })
			}
		}
		keyRun := func(rt *rapid.T) []offload.Key {
			a := rapid.IntRange(0, numKeys-1).Draw(rt, "from")
			return universe[a:rapid.IntRange(a+1, min(numKeys, a+4)).Draw(rt, "to")]
		}
		end := func(s *modelSession) {
			s.s.closed.Store(true)
			ns.releaseSession(s.s)
			s.alive, s.reqs = false, nil
			counts["ended"]++
		}

		// Two sessions with a request each to start with.
		for range 2 {
			nextSess++
			ms := &modelSession{s: &session{id: nextSess}, alive: true, reqs: []*modelReq{{id: "req0"}}}
			if _, _, err := ns.NewRequest(ms.s, "", "req0", nil); err != nil {
				rt.Fatal(err)
			}
			sessions = append(sessions, ms)
		}
		rt.Repeat(map[string]func(*rapid.T){
			"connect": func(rt *rapid.T) {
				if len(live()) >= 4 {
					rt.Skip("enough sessions")
				}
				nextSess++
				sessions = append(sessions, &modelSession{s: &session{id: nextSess}, alive: true})
			},
			"newRequest": func(rt *rapid.T) {
				s := pickSess(rt)
				nextReq++
				r := &modelReq{id: fmt.Sprint("req", nextReq%3)} // ids repeat across sessions
				if slices.ContainsFunc(s.reqs, func(x *modelReq) bool { return x.id == r.id }) {
					rt.Skip("id taken in this session")
				}
				params := rapid.SampledFrom([]string{"", `{"kv_load_tiers":[]}`, `{"kv_store_tiers":[]}`}).Draw(rt, "params")
				_, _, err := ns.NewRequest(s.s, "", r.id, []byte(params))
				if len(s.reqs) >= modelSessionRequests {
					// At its cap the session is refused; the others are not.
					if !errors.Is(err, ErrLimit) {
						rt.Fatalf("new request of a session holding %d requests (cap %d): %v, want ErrLimit", len(s.reqs), modelSessionRequests, err)
					}
					counts["refused at the cap"]++
					return
				}
				if err != nil {
					rt.Fatalf("new request: %v", err)
				}
				s.reqs = append(s.reqs, r)
			},
			"load": func(rt *rapid.T) {
				s := pickSess(rt)
				r := pickReq(rt, s, true)
				keys := keyRun(rt)
				if ready := readyRun(p, universe); len(ready) > 0 && rapid.IntRange(0, 3).Draw(rt, "ofReady") > 0 {
					// Mostly ask for what is there, so that loads happen.
					a := rapid.IntRange(0, len(ready)-1).Draw(rt, "from")
					keys = ready[a:rapid.IntRange(a+1, len(ready)).Draw(rt, "to")]
				}
				out := make([]offload.LookupResult, len(keys))
				hits, err := ns.Lookup(s.s, r.id, keys, true, out)
				if err != nil {
					rt.Fatalf("lookup: %v", err)
				}
				n := 0
				for n < hits && out[n] == offload.Hit {
					n++
				}
				if n == 0 {
					return
				}
				// Another client's stores between the lookup and the load
				// may evict what answered HIT.
				if rapid.IntRange(0, 2).Draw(rt, "storeBetween") == 0 {
					o := pickSess(rt)
					or := pickReq(rt, o, true)
					// Blocks not in the primary, as many as it has slots:
					// a store that evicts if anything can be evicted.
					var fresh []offload.Key
					for _, k := range universe {
						if _, in := p.RefCount(k); !in && len(fresh) < slots {
							fresh = append(fresh, k)
						}
					}
					if len(fresh) == 0 {
						fresh = keyRun(rt)
					}
					out, ok, err := ns.PrepareStore(o.s, or.id, fresh, nil)
					if err != nil {
						rt.Fatalf("prepare store between lookup and load: %v", err)
					}
					if ok && len(out.KeysToStore) > 0 {
						res := reservation{keys: slices.Clone(out.KeysToStore), slots: slices.Clone(out.Slots)}
						write(rt, arena, res, slotSize)
						if err := ns.CompleteStore(o.s, or.id, res.keys, true); err != nil {
							rt.Fatalf("complete store: %v", err)
						}
					}
				}
				readable := func(k offload.Key) bool { ref, ok := p.RefCount(k); return ok && ref >= 0 }
				var gone []offload.Key
				refs := make([]int32, n)
				for i, k := range keys[:n] {
					if !readable(k) {
						gone = append(gone, k)
					}
					refs[i], _ = p.RefCount(k)
				}
				allowMissing := rapid.Bool().Draw(rt, "allowMissing")
				sl, missing, err := ns.PrepareLoad(s.s, r.id, keys[:n], allowMissing)
				switch {
				case !allowMissing && len(gone) > 0:
					// The call fails and pins nothing.
					if !errors.Is(err, ErrProtocol) {
						rt.Fatalf("prepare load of %d keys gone since the lookup: %v, want ErrProtocol", len(gone), err)
					}
					for i, k := range keys[:n] {
						if ref, _ := p.RefCount(k); ref != refs[i] {
							rt.Fatalf("a failed prepare load pinned %v", k)
						}
					}
					counts["loads failed: evicted since the lookup"]++
					return
				case err != nil:
					rt.Fatalf("prepare load of HIT keys: %v", err)
				case missing != len(gone):
					rt.Fatalf("prepare load: %d missing, %d keys are gone", missing, len(gone))
				}
				for i, k := range keys[:n] {
					if sl[i] < 0 {
						if readable(k) && !slices.Contains(gone, k) {
							rt.Fatalf("prepare load: %v readable but answered missing", k)
						}
						continue
					}
					verifySlots(keys[i:i+1], sl[i:i+1], "load")
					r.pins = append(r.pins, k)
				}
				counts["loaded blocks"] += n - missing
				counts["missing at load (allow_missing)"] += missing
			},
			"completeLoad": func(rt *rapid.T) {
				s := pickSess(rt)
				r := pickReq(rt, s, false)
				if len(r.pins) == 0 {
					rt.Skip("no pin")
				}
				if err := ns.CompleteLoad(s.s, r.id, r.pins); err != nil {
					rt.Fatalf("complete load: %v", err)
				}
				r.pins = nil
				drop(s, r)
			},
			"prepareStore": func(rt *rapid.T) {
				s := pickSess(rt)
				r := pickReq(rt, s, true)
				out, ok, err := ns.PrepareStore(s.s, r.id, keyRun(rt), nil)
				if err != nil {
					rt.Fatalf("prepare store: %v", err)
				}
				if !ok || len(out.KeysToStore) == 0 {
					return
				}
				res := reservation{keys: slices.Clone(out.KeysToStore), slots: slices.Clone(out.Slots)}
				// Write now, or later (perhaps after someone's Reset).
				if rapid.Bool().Draw(rt, "writeNow") {
					write(rt, arena, res, slotSize)
					res.written = true
				}
				r.resv = append(r.resv, res)
				counts["reserved blocks"] += len(res.keys)
			},
			"put": func(rt *rapid.T) {
				// A store written and completed at once: blocks to load.
				s := pickSess(rt)
				r := pickReq(rt, s, true)
				out, ok, err := ns.PrepareStore(s.s, r.id, keyRun(rt), nil)
				if err != nil {
					rt.Fatalf("prepare store: %v", err)
				}
				if !ok || len(out.KeysToStore) == 0 {
					return
				}
				res := reservation{keys: slices.Clone(out.KeysToStore), slots: slices.Clone(out.Slots)}
				write(rt, arena, res, slotSize)
				if err := ns.CompleteStore(s.s, r.id, res.keys, true); err != nil {
					rt.Fatalf("complete store: %v", err)
				}
				counts["stored blocks"] += len(res.keys)
			},
			"completeStore": func(rt *rapid.T) {
				s := pickSess(rt)
				r := pickReq(rt, s, false)
				if len(r.resv) == 0 {
					rt.Skip("no reservation")
				}
				i := rapid.IntRange(0, len(r.resv)-1).Draw(rt, "which")
				res := r.resv[i]
				ok := rapid.IntRange(0, 4).Draw(rt, "ok") > 0
				if !res.written && ok {
					write(rt, arena, res, slotSize)
				}
				if err := ns.CompleteStore(s.s, r.id, res.keys, ok); err != nil {
					rt.Fatalf("complete store: %v", err)
				}
				r.resv = slices.Delete(r.resv, i, i+1)
				drop(s, r)
			},
			"finish": func(rt *rapid.T) {
				s := pickSess(rt)
				r := pickReq(rt, s, true)
				if err := ns.FinishRequest(s.s, r.id); err != nil {
					rt.Fatalf("finish: %v", err)
				}
				r.finished = true
				drop(s, r)
			},
			"reset": func(rt *rapid.T) {
				if rapid.IntRange(0, 3).Draw(rt, "rare") > 0 {
					rt.Skip("resets are rare") // or nothing stays to load
				}
				if err := ns.Reset(context.Background()); err != nil {
					rt.Fatalf("reset: %v", err)
				}
				counts["resets"]++
			},
			"crash": func(rt *rapid.T) {
				if rapid.IntRange(0, 1).Draw(rt, "rare") > 0 {
					rt.Skip("crashes are rarer than calls")
				}
				end(pickSess(rt))
			},
			"expireAll": func(rt *rapid.T) {
				// Every request is idle for the timeout at once.
				ns.expireIdle(time.Now().Add(time.Hour))
				for _, s := range live() {
					s.reqs = slices.DeleteFunc(s.reqs, func(r *modelReq) bool {
						// Holds outlive expiry while the session lives.
						r.finished = true
						return len(r.pins) == 0 && len(r.resv) == 0
					})
				}
				counts["expiries"]++
			},
			"step": func(rt *rapid.T) {
				if _, _, err := ns.ScheduleEnd(offload.ScheduleEnd{}); err != nil {
					rt.Fatal(err)
				}
			},
			"": func(rt *rapid.T) {
				checkHolds(rt, ns, p, live(), universe, slotSize)
			},
		})

		for _, s := range live() {
			end(s)
		}
		for i := 0; i < 10 && m.HasPendingWork(); i++ {
			ns.ScheduleEnd(offload.ScheduleEnd{})
		}
		st := p.Stats()
		if st.Pinned != 0 || st.Pending != 0 || len(ns.reqs) != 0 || len(ns.bySession) != 0 || ns.paramTotal.Load() != 0 {
			rt.Fatalf("left after every session ended: %+v, %d requests, %d sessions, %d param bytes", st, len(ns.reqs), len(ns.bySession), ns.paramTotal.Load())
		}
	})
}

// readyRun returns the keys ready in the primary, in universe order.
func readyRun(p *cpu.Primary, universe []offload.Key) []offload.Key {
	var out []offload.Key
	for _, k := range universe {
		if ref, ok := p.RefCount(k); ok && ref >= 0 {
			out = append(out, k)
		}
	}
	return out
}

// write fills a reservation's slots with their keys' content.
func write(rt *rapid.T, a offload.Arena, res reservation, size int) {
	for i, k := range res.keys {
		b, err := a.Slot(res.slots[i])
		if err != nil {
			rt.Fatal(err)
		}
		copy(b, blockContent(k, size))
	}
}

// checkHolds verifies the ready blocks' bytes and the accounting of pins
// and reservations.
func checkHolds(rt *rapid.T, ns *Namespace, p *cpu.Primary, live []*modelSession, universe []offload.Key, size int) {
	wantPinned := map[offload.Key]int32{}
	pending := 0
	for _, s := range live {
		for _, r := range s.reqs {
			for _, k := range r.pins {
				wantPinned[k]++
			}
			for _, res := range r.resv {
				pending += len(res.keys)
			}
		}
	}
	st := ns.mgr.Stats()
	if st.JobsInFlight == 0 && st.PendingPromotions == 0 {
		// With no tier job the primary's holds are exactly the sessions'.
		if p.Stats().Pending != pending {
			rt.Fatalf("primary pending %d, the sessions' reservations %d", p.Stats().Pending, pending)
		}
		for _, k := range universe {
			ref, ok := p.RefCount(k)
			if ok && ref >= 0 && ref != wantPinned[k] {
				rt.Fatalf("ref(%v) = %d, the sessions' pins %d", k, ref, wantPinned[k])
			}
		}
	}
	checkReadyBytes(rt, p, universe, size)
	for _, r := range ns.reqs {
		if r.sess != nil && r.sess.closed.Load() {
			rt.Fatalf("request %s of an ended session is still registered", r.ctx.ID)
		}
	}
}

// checkReadyBytes verifies that every ready block of universe in p holds
// its key's content.
func checkReadyBytes(rt *rapid.T, p *cpu.Primary, universe []offload.Key, size int) {
	for _, k := range universe {
		slot, ok := p.SlotOf(k)
		if ref, _ := p.RefCount(k); !ok || ref < 0 {
			continue
		}
		b, err := p.Arena().Slot(slot)
		if err != nil {
			rt.Fatal(err)
		}
		if !bytes.Equal(b, blockContent(k, size)) {
			rt.Fatalf("ready block %v holds another block's bytes", k)
		}
	}
}

// modelNamespace is the namespace the model tests drive: a primary of
// slots slots and one memory tier of tierBlocks blocks (0: unbounded).
func modelNamespace(rt interface{ Fatal(...any) }, slotSize, slots, tierBlocks int, budget tiering.BudgetConfig) (*Namespace, *cpu.Primary, *tiering.Manager) {
	p, err := cpu.New(cpu.Config{SlotSize: slotSize, Capacity: int64(slots * slotSize), Events: true})
	if err != nil {
		rt.Fatal(err)
	}
	tier, err := memory.New(memory.Config{Name: "mem", Medium: offload.MediumStorage, Locality: offload.LocalityLocal, CapacityBlocks: tierBlocks})
	if err != nil {
		rt.Fatal(err)
	}
	m, err := tiering.New(tiering.Config{Primary: p, Tiers: []offload.SecondaryTier{tier}, Budget: budget})
	if err != nil {
		rt.Fatal(err)
	}
	limits, _ := Limits{}.withDefaults()
	ns, err := newNamespace(ManagerNamespace("", m, p, offload.Parser{}), limits, slog.New(slog.DiscardHandler), nil, nil)
	if err != nil {
		rt.Fatal(err)
	}
	return ns, p, m
}
