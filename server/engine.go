package server

import (
	"context"
	"fmt"
	"time"

	kvtierv1 "github.com/kvtier/kvtier/api/kvtier/v1"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/region"
)

// vLLM manager mode: engines attach to a namespace whose primary is their
// CPU cache (EngineAttach), and talk to it once per step (EngineStep).
//
// Two kinds of lease keep the engine's scheduler from waiting on the
// daemon per key or per request:
//
//   - a lookup lease: a lookup that finds a block in the primary pins it
//     for the request (as PrepareLoad does) and answers its slot, so the
//     engine's prepare_load needs no call and no eviction can race it; the
//     engine unpins it with the load's completion, or drops it unused;
//   - slot leases: the namespace keeps a pool of free slots leased to each
//     engine (cpu.Primary.Lease), from which the engine assigns its stores
//     locally; the step's stores bind them to their keys.
//
// Everything an engine holds — pins through its requests, leased slots —
// belongs to its session and is released when the session ends.

// maxEngineLeases bounds the free slots one engine may hold leased.
const maxEngineLeases = 4096

// leaser is implemented by managers that lease slots (tiering.Manager).
type leaser interface {
	Lease(n int) ([]int64, []offload.Key, error)
	Bind(keys []offload.Key, slots []int64, req *offload.ReqContext, success bool) (int, error)
	Unlease(slots []int64) error
}

// EngineFactory builds the namespace of an engine layout (its primary on a
// shareable arena, with the configured tiers laid out for it).
type EngineFactory func(ctx context.Context, name string, l region.Layout) (NamespaceConfig, error)

func (sv *service) EngineAttach(ctx context.Context, in *kvtierv1.EngineAttachRequest) (*kvtierv1.EngineAttachResponse, error) {
	s := sv.s
	if s.cfg.Engines == nil {
		return nil, toStatus(fmt.Errorf("%w: this daemon does not attach engines (manager mode is off)", ErrProtocol))
	}
	l, err := region.DecodeLayout([]byte(in.GetLayout()))
	if err == nil {
		if l.NumBlocks <= 0 {
			l.NumBlocks = 1 // the daemon sizes an engine namespace itself
		}
		err = l.Validate()
	}
	if err != nil {
		return nil, regionStatus(err)
	}
	ns, err := s.engineNamespace(ctx, l)
	if err != nil {
		return nil, toStatus(err)
	}
	a := ns.Arena()
	if a.SlotSize != l.RowStride {
		return nil, toStatus(fmt.Errorf("%w: namespace %q has %d-byte slots, the engine's rows are %d bytes", ErrInvalidArgument, ns.name, a.SlotSize, l.RowStride))
	}
	return &kvtierv1.EngineAttachResponse{Namespace: ns.name, SlotSize: int64(a.SlotSize), NumSlots: int64(a.NumSlots), FdSocket: s.fdPath, Epoch: a.Epoch}, nil
}

// engineNamespace returns the namespace of layout l, creating it.
func (s *Server) engineNamespace(ctx context.Context, l region.Layout) (*Namespace, error) {
	name := l.Namespace()
	if ns, ok := s.Namespace(name); ok {
		return ns, nil
	}
	s.attachMu.Lock()
	defer s.attachMu.Unlock()
	if ns, ok := s.Namespace(name); ok {
		return ns, nil
	}
	if n := len(s.allNamespaces()); n >= s.cfg.MaxNamespaces {
		return nil, fmt.Errorf("%w: %d namespaces (server.max_engine_namespaces); an engine with a new layout cannot attach", ErrLimit, n)
	}
	nc, err := s.cfg.Engines(ctx, name, l)
	if err != nil {
		return nil, fmt.Errorf("engine namespace %s: %w", name, err)
	}
	nc.Name = name
	ns, err := newNamespace(nc, s.limits, s.log, s.warnings.Record, &s.paramTotal)
	if err != nil {
		return nil, err
	}
	s.nsMu.Lock()
	s.namespaces[name] = ns
	s.order = append(s.order, ns)
	s.nsMu.Unlock()
	s.log.Info("engine namespace created", "namespace", name, "slot_size", ns.Arena().SlotSize, "slots", ns.Arena().NumSlots, "model", l.Model)
	return ns, nil
}

func (sv *service) EngineStep(ctx context.Context, in *kvtierv1.EngineStepRequest) (*kvtierv1.EngineStepResponse, error) {
	ns, err := sv.ns(in.GetNamespace())
	if err != nil {
		return nil, toStatus(err)
	}
	out, err := ns.EngineStep(sessionOf(ctx), in)
	if err != nil {
		return nil, toStatus(err)
	}
	return out, nil
}

// EngineStep runs one engine step (see the package's manager-mode notes):
// requests, unpins, stores, the cache reset, touches, lookups, finishes
// and returned slots in that order, then the manager's step end, the
// lease top-up and the step's events. An entry that names an unknown
// request or a slot not leased to the session is skipped with a warning
// in the answer: one bad entry must not cost the engine its step.
func (ns *Namespace) EngineStep(s *session, in *kvtierv1.EngineStepRequest) (*kvtierv1.EngineStepResponse, error) {
	lm, ok := ns.mgr.(leaser)
	if !ok {
		return nil, fmt.Errorf("%w: namespace %q does not lease slots", ErrProtocol, ns.name)
	}
	if s == nil {
		return nil, fmt.Errorf("%w: manager mode needs a client session", ErrProtocol)
	}
	if e := in.GetEpoch(); e != 0 && e != ns.epoch {
		// The engine's slots and pins are another arena's: binding or
		// unpinning them here would name this arena's slots.
		return nil, fmt.Errorf("%w: the step is for epoch %016x of namespace %q, which is at %016x (the daemon restarted): attach again", ErrStaleEpoch, e, ns.name, ns.epoch)
	}
	keysOf := func(packed []byte, size uint32) ([]offload.Key, error) {
		return packedKeys(packed, size, ns.limits.MaxKeysPerCall)
	}
	if err := ns.lock(); err != nil {
		return nil, err
	}
	defer ns.mu.Unlock()
	out := &kvtierv1.EngineStepResponse{}
	warn := func(format string, args ...any) {
		if len(out.Warnings) < 64 {
			out.Warnings = append(out.Warnings, fmt.Sprintf(format, args...))
		}
	}
	for _, nr := range in.GetNewRequests() {
		if _, _, err := ns.newRequestLocked(s, nr.GetRequestId(), []byte(nr.GetKvTransferParams())); err != nil {
			warn("new request %q: %v", nr.GetRequestId(), err)
		}
	}
	for _, u := range in.GetUnpins() {
		keys, err := keysOf(u.GetPackedKeys(), u.GetKeySize())
		if err != nil {
			return nil, err
		}
		r, err := ns.req(s, u.GetRequestId())
		if err == nil {
			err = ns.completeLoadLocked(r, u.GetRequestId(), keys)
		}
		if err != nil {
			warn("unpin for %q: %v", u.GetRequestId(), err)
		}
	}
	leases := ns.leasesOf(s)
	for _, st := range in.GetStores() {
		keys, err := keysOf(st.GetPackedKeys(), st.GetKeySize())
		if err != nil {
			return nil, err
		}
		slots := st.GetSlots()
		if len(slots) != len(keys) {
			warn("store for %q: %d keys and %d slots", st.GetRequestId(), len(keys), len(slots))
			continue
		}
		if i := notLeased(leases, slots); i >= 0 {
			warn("store for %q: slot %d is not leased to this engine", st.GetRequestId(), slots[i])
			continue
		}
		var rc *offload.ReqContext
		if r, err := ns.req(s, st.GetRequestId()); err == nil {
			rc = r.ctx
		} else {
			// The request is gone (finished and dropped, or expired): the
			// block is still the engine's to commit; it cascades under
			// the default filters.
			rc = offload.Background(s.scope(st.GetRequestId()))
		}
		for _, sl := range slots {
			delete(leases, sl)
		}
		if _, err := lm.Bind(keys, slots, rc, st.GetSuccess()); err != nil {
			warn("store for %q: %v", st.GetRequestId(), err)
		}
	}
	// vLLM resets between steps, so the reset comes before the lookups
	// of the step after it: a block the reset drops is not leased to them.
	// Blocks held through pins (loads in flight) survive it.
	if in.GetResetCache() {
		if err := ns.mgr.Reset(context.Background()); err != nil {
			warn("reset: %v", err)
		}
	}
	for _, t := range in.GetTouches() {
		keys, err := keysOf(t.GetPackedKeys(), t.GetKeySize())
		if err != nil {
			return nil, err
		}
		if r, err := ns.req(s, t.GetRequestId()); err == nil {
			ns.mgr.Touch(keys, r.ctx)
		}
	}
	var lookups []stepLookup
	for _, lk := range in.GetLookups() {
		keys, err := keysOf(lk.GetPackedKeys(), lk.GetKeySize())
		if err != nil {
			return nil, err
		}
		res := &kvtierv1.EngineLookupResult{RequestId: lk.GetRequestId(), Found: make([]byte, len(keys))}
		out.Lookups = append(out.Lookups, res)
		r, err := ns.liveReq(s, lk.GetRequestId(), "lookup")
		if err != nil {
			warn("lookup for %q: %v", lk.GetRequestId(), err)
			continue // all unknown
		}
		l := stepLookup{res: res, r: r, keys: keys, slots: make([]int64, len(keys))}
		for i := range keys {
			ns.lookupKeyLocked(&l, i)
		}
		lookups = append(lookups, l)
	}
	for _, id := range in.GetFinishedRequestIds() {
		r, err := ns.req(s, id)
		if err == nil {
			err = ns.finishLocked(r, id)
		}
		if err != nil {
			warn("finish %q: %v", id, err)
		}
	}
	if ret := in.GetReturnSlots(); len(ret) > 0 {
		if i := notLeased(leases, ret); i >= 0 {
			warn("return: slot %d is not leased to this engine", ret[i])
		} else if err := lm.Unlease(ret); err != nil {
			warn("return: %v", err)
		} else {
			for _, sl := range ret {
				delete(leases, sl)
			}
		}
	}
	ns.mgr.ScheduleEnd(offload.ScheduleEnd{NewReqIDs: scoped(s, in.GetScheduledRequestIds()), PreemptedReqIDs: scoped(s, in.GetPreemptedRequestIds())})
	ns.settleLookupsLocked(lookups)
	for _, l := range lookups {
		for i, f := range l.res.Found {
			if f == byte(kvtierv1.RegionFound_REGION_FOUND_HIT) {
				l.res.Slots = append(l.res.Slots, l.slots[i])
			}
		}
	}
	ns.lastStep = time.Now()
	want := min(int(in.GetWantFreeSlots()), maxEngineLeases)
	if need := want - len(leases); need > 0 {
		slots, _, err := lm.Lease(need)
		if err != nil {
			return nil, err
		}
		for _, sl := range slots {
			leases[sl] = struct{}{}
		}
		out.GrantedSlots = slots
	}
	for _, e := range ns.mgr.TakeEvents() {
		packed, size := packKeys(e.Keys)
		out.Events = append(out.Events, &kvtierv1.RegionEvent{
			PackedKeys: packed, KeySize: size, Medium: kvtierv1.Medium(e.Medium), Locality: kvtierv1.Locality(e.Locality),
			Removed: e.Removed, Tier: e.Tier,
		})
	}
	return out, nil
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

// settleSlice is how long the settle pass sleeps between asks.
const settleSlice = 250 * time.Microsecond

// settleLookupsLocked gives the step's unknown answers up to
// EngineLookupSettle to settle: an fs tier answers an existence check on
// its worker within microseconds and a promotion of a few blocks takes
// about a millisecond, but each would otherwise cost the engine a whole
// step (on vLLM's CPU backend, tens to hundreds of milliseconds) before
// it asks again. The lock is released while it waits (other engines'
// steps and the tiers' completions go on), the unknown keys are asked
// again, and what that starts (promotions, checks) is flushed by a step
// end of the daemon's own, as an idle engine's auto step would. A
// request finished or released meanwhile is left as it is.
func (ns *Namespace) settleLookupsLocked(lookups []stepLookup) {
	budget := ns.limits.EngineLookupSettle
	if budget <= 0 || !ns.anyUnknownLocked(lookups) {
		return
	}
	deadline := time.Now().Add(budget)
	for time.Now().Before(deadline) {
		ns.mu.Unlock()
		time.Sleep(settleSlice)
		ns.mu.Lock()
		if ns.closed {
			return
		}
		asked := false
		for li := range lookups {
			l := &lookups[li]
			if !ns.live(l.r) {
				continue
			}
			for i, f := range l.res.Found {
				if f == 0 {
					ns.lookupKeyLocked(l, i)
					asked = true
				}
			}
		}
		if !asked || !ns.anyUnknownLocked(lookups) {
			return
		}
		ns.mgr.ScheduleEnd(offload.ScheduleEnd{})
	}
}

// live reports whether r is still the registered, active request of its
// id (another call may have finished, expired or released it while the
// settle pass waited).
func (ns *Namespace) live(r *request) bool {
	if r.finished || r.expired || r.sess == nil {
		return false
	}
	cur, ok := ns.reqs[r.sess.scope(r.id)]
	return ok && cur == r
}

// anyUnknownLocked reports whether a live request of lookups has a key
// still unknown.
func (ns *Namespace) anyUnknownLocked(lookups []stepLookup) bool {
	for _, l := range lookups {
		if !ns.live(l.r) {
			continue
		}
		for _, f := range l.res.Found {
			if f == 0 {
				return true
			}
		}
	}
	return false
}

// leasesOf returns the slots leased to s (created empty).
func (ns *Namespace) leasesOf(s *session) map[int64]struct{} {
	if ns.leases == nil {
		ns.leases = make(map[*session]map[int64]struct{})
	}
	m := ns.leases[s]
	if m == nil {
		m = make(map[int64]struct{})
		ns.leases[s] = m
	}
	return m
}

// releaseLeases gives back the slots leased to s; the caller holds the
// mutex.
func (ns *Namespace) releaseLeases(s *session) {
	m := ns.leases[s]
	if len(m) == 0 {
		delete(ns.leases, s)
		return
	}
	slots := make([]int64, 0, len(m))
	for sl := range m {
		slots = append(slots, sl)
	}
	if lm, ok := ns.mgr.(leaser); ok {
		if err := lm.Unlease(slots); err != nil {
			ns.log.Error("release the slots leased to an ended session", "slots", len(slots), "err", err)
		}
	}
	delete(ns.leases, s)
}

// notLeased returns the index of the first slot not in leases, or -1.
func notLeased(leases map[int64]struct{}, slots []int64) int {
	for i, sl := range slots {
		if _, ok := leases[sl]; !ok {
			return i
		}
	}
	return -1
}

func scoped(s *session, ids []string) []string {
	if len(ids) == 0 {
		return nil
	}
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = s.scope(id)
	}
	return out
}
