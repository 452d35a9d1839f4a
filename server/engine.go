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
	ns, err := s.engineNamespace(ctx, l, principalOf(ctx).t)
	if err != nil {
		return nil, toStatus(err)
	}
	a := ns.Arena()
	if a.SlotSize != l.RowStride {
		return nil, toStatus(fmt.Errorf("%w: namespace %q has %d-byte slots, the engine's rows are %d bytes", ErrInvalidArgument, ns.name, a.SlotSize, l.RowStride))
	}
	tk, err := s.arenaTicket(ns.name)
	if err != nil {
		return nil, toStatus(err)
	}
	return &kvtierv1.EngineAttachResponse{Namespace: ns.name, SlotSize: int64(a.SlotSize), NumSlots: int64(a.NumSlots), FdSocket: s.fdPath, Epoch: a.Epoch, Ticket: tk}, nil
}

// engineNamespace returns the namespace of layout l for tenant t's engines
// (t nil: the admin's), creating it. A tenant's is a namespace of its own,
// with its own primary and arena, named after the layout and the tenant.
func (s *Server) engineNamespace(ctx context.Context, l region.Layout, t *tenant) (*Namespace, error) {
	name := l.Namespace()
	if t != nil {
		name += "~" + t.name
	}
	if ns, ok := s.Namespace(name); ok {
		return ns, nil
	}
	s.attachMu.Lock()
	defer s.attachMu.Unlock()
	if ns, ok := s.Namespace(name); ok {
		return ns, nil
	}
	if n := len(s.allNamespaces()); n >= s.cfg.MaxNamespaces {
		return nil, fmt.Errorf("%w: %d namespaces (engines.max_namespaces); an engine with a new layout cannot attach", ErrLimit, n)
	}
	if t != nil {
		// Every tenant may create a share of the engine namespaces, so
		// that one tenant's layouts cannot keep another's engines out.
		if n, most := s.tenancy.ownedBy(t), s.tenantEngineNamespaces(); n >= most {
			t.ctr.refusals.Add(1)
			return nil, fmt.Errorf("%w: tenant %q has %d engine namespaces, its share of engines.max_namespaces", ErrLimit, t.name, n)
		}
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
	if t != nil {
		s.tenancy.own(name, t)
	}
	s.nsMu.Lock()
	s.namespaces[name] = ns
	s.order = append(s.order, ns)
	s.nsMu.Unlock()
	owner := ""
	if t != nil {
		owner = t.name
	}
	s.log.Info("engine namespace created", "namespace", name, "slot_size", ns.Arena().SlotSize, "slots", ns.Arena().NumSlots, "model", l.Model, "tenant", owner)
	return ns, nil
}

// tenantEngineNamespaces is how many engine namespaces one tenant's
// engines may create: an even share of those the daemon allows beyond its
// configured namespaces, at least one.
func (s *Server) tenantEngineNamespaces() int {
	engines := s.cfg.MaxNamespaces - len(s.cfg.Namespaces)
	return max(engines/(len(s.tenancy.tenants)+1), 1)
}

func (sv *service) EngineStep(ctx context.Context, in *kvtierv1.EngineStepRequest) (*kvtierv1.EngineStepResponse, error) {
	ns, sc, err := sv.openEngine(ctx, in.GetNamespace())
	if err != nil {
		return nil, err
	}
	out, err := ns.EngineStep(sessionOf(ctx), in, sc.keys)
	if err != nil {
		return nil, toStatus(err)
	}
	return out, nil
}

func (sv *service) EngineReserve(ctx context.Context, in *kvtierv1.EngineReserveRequest) (*kvtierv1.EngineReserveResponse, error) {
	ns, sc, err := sv.openEngine(ctx, in.GetNamespace())
	if err != nil {
		return nil, err
	}
	out, err := ns.EngineReserve(sessionOf(ctx), in, sc.keys)
	if err != nil {
		return nil, toStatus(err)
	}
	return out, nil
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
	if err := ns.mgr.Unlease(slots); err != nil {
		ns.log.Error("release the slots leased to an ended session", "slots", len(slots), "err", err)
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
