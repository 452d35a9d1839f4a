// One engine step of manager mode (EngineStep): the batch a vLLM engine
// sends once per scheduler step, applied in phases under the namespace's
// lock, and the answer its next step reads.

package server

import (
	"context"
	"fmt"
	"time"

	kvtierv1 "github.com/kvtier/kvtier/api/kvtier/v1"
	"github.com/kvtier/kvtier/keyspace"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/tiering"
)

// EngineStep runs one engine step (see the package's manager-mode notes):
// requests, unpins, stores, the cache reset, touches, lookups, finishes
// and returned slots in that order, then the manager's step end, the
// lease top-up and the step's events. An entry that names an unknown
// request or a slot not leased to the session is skipped with a warning
// in the answer: one bad entry must not cost the engine its step.
func (ns *Namespace) EngineStep(s *session, in *kvtierv1.EngineStepRequest, sp keyspace.Space) (*kvtierv1.EngineStepResponse, error) {
	lm, err := ns.engineCall(s, in.GetEpoch(), "step")
	if err != nil {
		return nil, err
	}
	if err := ns.lock(); err != nil {
		return nil, err
	}
	defer ns.mu.Unlock()
	st := &engineStep{ns: ns, s: s, lm: lm, in: in, space: sp, out: &kvtierv1.EngineStepResponse{}, leases: ns.leasesOf(s)}
	for _, phase := range []func() error{st.newRequests, st.unpins, st.stores, st.reset, st.touches, st.lookups, st.finishes, st.returns, st.end} {
		if err := phase(); err != nil {
			return nil, err
		}
	}
	return st.out, nil
}

// EngineReserve answers an engine whose store found too few leased slots
// (see the API): which keys the daemon holds, in the primary or promoting
// into it, and up to in.more_slots more slots leased to s. It pins
// nothing and ends no step.
func (ns *Namespace) EngineReserve(s *session, in *kvtierv1.EngineReserveRequest, sp keyspace.Space) (*kvtierv1.EngineReserveResponse, error) {
	lm, err := ns.engineCall(s, in.GetEpoch(), "reserve")
	if err != nil {
		return nil, err
	}
	keys, err := spaceKeys(sp, in.GetPackedKeys(), in.GetKeySize(), ns.limits.MaxKeysPerCall)
	if err != nil {
		return nil, err
	}
	if err := ns.lock(); err != nil {
		return nil, err
	}
	defer ns.mu.Unlock()
	out := &kvtierv1.EngineReserveResponse{Found: make([]byte, len(keys))}
	missing := 0
	for i, k := range keys {
		out.Found[i] = byte(kvtierv1.RegionFound_REGION_FOUND_MISS)
		if ns.mgr.Source(k) != "" {
			out.Found[i] = byte(kvtierv1.RegionFound_REGION_FOUND_HIT)
		} else {
			missing++
		}
	}
	if n := min(int(in.GetMoreSlots()), missing-int(in.GetFreeSlots())); n > 0 {
		if out.GrantedSlots, err = leaseMore(lm, ns.leasesOf(s), n); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// engineCall checks a manager-mode call (what names it in errors) of
// session s for epoch: the namespace leases slots, and the call is for
// this arena.
func (ns *Namespace) engineCall(s *session, epoch uint64, what string) (*tiering.Manager, error) {
	lm := ns.mgr
	if s == nil {
		return nil, fmt.Errorf("%w: manager mode needs a client session", ErrProtocol)
	}
	if epoch != 0 && epoch != ns.epoch {
		// The engine's slots and pins are another arena's: binding or
		// unpinning them here would name this arena's slots.
		return nil, fmt.Errorf("%w: the %s is for epoch %016x of namespace %q, which is at %016x (the daemon restarted): attach again", ErrStaleEpoch, what, epoch, ns.name, ns.epoch)
	}
	return lm, nil
}

// leaseMore leases up to n more free slots into leases, the slots an
// engine session holds, which stay within maxEngineLeases.
func leaseMore(lm *tiering.Manager, leases map[int64]struct{}, n int) ([]int64, error) {
	if n = min(n, maxEngineLeases-len(leases)); n <= 0 {
		return nil, nil
	}
	slots, _, err := lm.Lease(n)
	if err != nil {
		return nil, err
	}
	for _, sl := range slots {
		leases[sl] = struct{}{}
	}
	return slots, nil
}

// engineStep is one EngineStep in progress, under the namespace's lock.
// Its phases run in the order EngineStep lists; each returns an error
// only for a request the engine could not have meant (a key list that
// does not decode), which fails the call.
type engineStep struct {
	ns      *Namespace
	s       *session
	lm      *tiering.Manager
	in      *kvtierv1.EngineStepRequest
	out     *kvtierv1.EngineStepResponse
	leases  map[int64]struct{} // the session's leased slots
	space   keyspace.Space     // the engine's keys' (a tenant's engine: its own)
	looking []stepLookup       // the step's lookups, settled at its end
}

// warn adds a warning to the answer (at most 64).
func (st *engineStep) warn(format string, args ...any) {
	if len(st.out.Warnings) < 64 {
		st.out.Warnings = append(st.out.Warnings, fmt.Sprintf(format, args...))
	}
}

func (st *engineStep) keys(packed []byte, size uint32) ([]offload.Key, error) {
	return spaceKeys(st.space, packed, size, st.ns.limits.MaxKeysPerCall)
}

// spaceKeys decodes an engine's packed keys into key space sp.
func spaceKeys(sp keyspace.Space, packed []byte, size uint32, max int) ([]offload.Key, error) {
	keys, err := packedKeys(packed, size, max) // checks each engine key
	if err != nil || !sp.Tagged() || len(keys) == 0 {
		return keys, err
	}
	// Split again behind the tag (Namespace.PackedKeys's splitting, one
	// allocation for the batch); a key near the length bound does not fit.
	keys = splitKeys(packed, int(size), len(keys), sp)
	if !keys[0].Valid() {
		return nil, fmt.Errorf("%w: key_size %d does not fit behind a key space's tag (at most %d)", offload.ErrInvalidKey, size, offload.MaxKeyLen-keyspace.TagLen)
	}
	return keys, nil
}

func (st *engineStep) newRequests() error {
	for _, nr := range st.in.GetNewRequests() {
		if _, _, err := st.ns.newRequestLocked(st.s, nr.GetRequestId(), []byte(nr.GetKvTransferParams())); err != nil {
			st.warn("new request %q: %v", nr.GetRequestId(), err)
		}
	}
	return nil
}

func (st *engineStep) unpins() error {
	for _, u := range st.in.GetUnpins() {
		keys, err := st.keys(u.GetPackedKeys(), u.GetKeySize())
		if err != nil {
			return err
		}
		r, err := st.ns.req(st.s, u.GetRequestId())
		if err == nil {
			err = st.ns.completeLoadLocked(r, u.GetRequestId(), keys)
		}
		if err != nil {
			st.warn("unpin for %q: %v", u.GetRequestId(), err)
		}
	}
	return nil
}

// stores binds the engine's written slots to their keys.
func (st *engineStep) stores() error {
	for _, store := range st.in.GetStores() {
		keys, err := st.keys(store.GetPackedKeys(), store.GetKeySize())
		if err != nil {
			return err
		}
		slots := store.GetSlots()
		if len(slots) != len(keys) {
			st.warn("store for %q: %d keys and %d slots", store.GetRequestId(), len(keys), len(slots))
			continue
		}
		if i := notLeased(st.leases, slots); i >= 0 {
			st.warn("store for %q: slot %d is not leased to this engine", store.GetRequestId(), slots[i])
			continue
		}
		var rc *offload.ReqContext
		if r, err := st.ns.req(st.s, store.GetRequestId()); err == nil {
			rc = r.ctx
		} else {
			// The request is gone (finished and dropped, or expired): the
			// block is still the engine's to commit; it cascades under
			// the default filters.
			rc = offload.Background(st.s.scope(store.GetRequestId()))
		}
		for _, sl := range slots {
			delete(st.leases, sl)
		}
		if _, err := st.lm.Bind(keys, slots, rc, store.GetSuccess()); err != nil {
			st.warn("store for %q: %v", store.GetRequestId(), err)
		}
	}
	return nil
}

// reset: vLLM resets between steps, so the reset comes before the
// lookups of the step after it: a block the reset drops is not leased to
// them. Blocks held through pins (loads in flight) survive it.
func (st *engineStep) reset() error {
	if st.in.GetResetCache() {
		if err := st.ns.mgr.Reset(context.Background()); err != nil {
			st.warn("reset: %v", err)
		}
	}
	return nil
}

func (st *engineStep) touches() error {
	for _, t := range st.in.GetTouches() {
		keys, err := st.keys(t.GetPackedKeys(), t.GetKeySize())
		if err != nil {
			return err
		}
		if r, err := st.ns.req(st.s, t.GetRequestId()); err == nil {
			st.ns.mgr.Touch(keys, r.ctx)
		}
	}
	return nil
}

// lookups answers each key (a HIT is leased: pinned for the request);
// those left unsure are settled at the step's end.
func (st *engineStep) lookups() error {
	for _, lk := range st.in.GetLookups() {
		keys, err := st.keys(lk.GetPackedKeys(), lk.GetKeySize())
		if err != nil {
			return err
		}
		res := &kvtierv1.EngineLookupResult{RequestId: lk.GetRequestId(), Found: make([]byte, len(keys))}
		st.out.Lookups = append(st.out.Lookups, res)
		r, err := st.ns.liveReq(st.s, lk.GetRequestId(), "lookup")
		if err != nil {
			st.warn("lookup for %q: %v", lk.GetRequestId(), err)
			continue // all unknown
		}
		l := stepLookup{res: res, r: r, keys: keys, slots: make([]int64, len(keys))}
		for i := range keys {
			st.ns.lookupKeyLocked(&l, i)
		}
		st.looking = append(st.looking, l)
	}
	return nil
}

func (st *engineStep) finishes() error {
	for _, id := range st.in.GetFinishedRequestIds() {
		r, err := st.ns.req(st.s, id)
		if err == nil {
			err = st.ns.finishLocked(r, id)
		}
		if err != nil {
			st.warn("finish %q: %v", id, err)
		}
	}
	return nil
}

// returns gives back the free slots the engine no longer wants leased.
func (st *engineStep) returns() error {
	ret := st.in.GetReturnSlots()
	if len(ret) == 0 {
		return nil
	}
	if i := notLeased(st.leases, ret); i >= 0 {
		st.warn("return: slot %d is not leased to this engine", ret[i])
	} else if err := st.lm.Unlease(ret); err != nil {
		st.warn("return: %v", err)
	} else {
		for _, sl := range ret {
			delete(st.leases, sl)
		}
	}
	return nil
}

// end ends the manager's step, settles the lookups, tops the engine's
// leased slots up to what it wants and collects the step's events.
func (st *engineStep) end() error {
	ns, in, out := st.ns, st.in, st.out
	ns.mgr.ScheduleEnd(offload.ScheduleEnd{NewReqIDs: scoped(st.s, in.GetScheduledRequestIds()), PreemptedReqIDs: scoped(st.s, in.GetPreemptedRequestIds())})
	ns.settleLookupsLocked(st.looking)
	for _, l := range st.looking {
		for i, f := range l.res.Found {
			if f == byte(kvtierv1.RegionFound_REGION_FOUND_HIT) {
				l.res.Slots = append(l.res.Slots, l.slots[i])
			}
		}
	}
	ns.lastStep = time.Now()
	if need := int(in.GetWantFreeSlots()) - len(st.leases); need > 0 {
		slots, err := leaseMore(st.lm, st.leases, need)
		if err != nil {
			return err
		}
		out.GrantedSlots = slots
	}
	if in.GetKeepEvents() {
		return nil
	}
	for _, e := range ns.mgr.TakeEvents() {
		keys := e.Keys
		if st.space.Tagged() {
			// The engine knows its keys without the space's tag.
			keys = make([]offload.Key, 0, len(e.Keys))
			for _, k := range e.Keys {
				if raw, ok := st.space.Strip(k); ok {
					keys = append(keys, raw)
				}
			}
		}
		packed, size := packKeys(keys)
		out.Events = append(out.Events, &kvtierv1.RegionEvent{
			PackedKeys: packed, KeySize: size, Medium: kvtierv1.Medium(e.Medium), Locality: kvtierv1.Locality(e.Locality),
			Removed: e.Removed, Tier: e.Tier,
		})
	}
	return nil
}

// stepLookup is one request's lookup in an engine step: its answer, and
// the slot of each key answered HIT.
type stepLookup struct {
	res   *kvtierv1.EngineLookupResult
	r     *request
	keys  []offload.Key
	slots []int64
}

// lookupKeyLocked answers key i of l: HIT (pinned for the request: the
// lookup lease, so that the engine's prepare_load needs no call and
// cannot race an eviction), MISS, or left unknown (a promotion is on its
// way or a tier has not settled: asked again).
func (ns *Namespace) lookupKeyLocked(l *stepLookup, i int) {
	k := l.keys[i]
	switch ns.mgr.Lookup(k, l.r.ctx) {
	case offload.Hit:
		sl, err := ns.mgr.PrepareLoad([]offload.Key{k}, l.r.ctx)
		if err != nil {
			return
		}
		if l.r.pins == nil {
			l.r.pins = make(map[offload.Key]int32)
		}
		l.r.pins[k]++
		l.res.Found[i] = byte(kvtierv1.RegionFound_REGION_FOUND_HIT)
		l.slots[i] = sl[0]
	case offload.Miss:
		l.res.Found[i] = byte(kvtierv1.RegionFound_REGION_FOUND_MISS)
	}
}
