package server

import (
	"fmt"
	"sync"
)

// Holds: the primary slots a tenant's block-stream requests keep pinned
// (a get, while its blocks go out) or reserved (a put, while its blocks
// come in). Neither can be evicted, and neither can the blocks its router
// pins hold, so a tenant that reads or writes slowly, or pins, could keep
// more of the primary than its quota, and another tenant's stores would
// then evict that tenant's own blocks or fail. A tenant's holds and its
// pins together stay within its quota of a namespace's primary (an even
// share of the slots, slots ÷ (tenants + 1), when it has no quota): a
// stream request past it is refused with RESOURCE_EXHAUSTED, a pin past it
// answered refused — its own, never another tenant's. Lock order: the
// namespace's mutex, then holds.mu. The stream's per-request deadline
// (requestDeadline) bounds how long a hold lasts. The admin (peer daemons,
// remote engines) is not bounded here, nor a tenant in an engine namespace
// its own engines created.

type holdKey struct {
	t  *tenant
	ns *Namespace
}

// holds counts the slots held per tenant and namespace.
type holds struct {
	mu sync.Mutex
	n  map[holdKey]int
}

// holdLimit is the slots tenant t may keep from eviction in ns's primary:
// its quota (an even share without one) less the router pins its blocks
// hold, so that its pins and its stream requests together never pass its
// quota and a tenant within its quota always has another's blocks to evict.
func (s *Server) holdLimit(ns *Namespace, t *tenant) int {
	q := 0
	if ns.quota != nil {
		q = ns.quota(t.space.ID())
	}
	if q <= 0 {
		q = max(ns.arena.NumSlots()/(len(s.tenancy.tenants)+1), 1)
	}
	return q - ns.mgr.PinsOf(t.space.ID())
}

// pinRoom is how many new router pins tenant t may take in ns now: what
// its stream requests and pins leave of its quota. The caller holds ns.mu
// and calls done once the pins are taken (holds cannot grow meanwhile).
func (s *Server) pinRoom(ns *Namespace, t *tenant) (room int, done func()) {
	if s.tenancy.ownerOf(ns.name) == t {
		return -1, func() {}
	}
	h := &s.holds
	h.mu.Lock()
	return max(s.holdLimit(ns, t)-h.n[holdKey{t, ns}], 0), h.mu.Unlock
}

// hold counts n slots against the tenant of sc in ns and returns the
// function that gives them back, or ErrNoSpace when they would take it
// past its limit.
func (s *Server) hold(ns *Namespace, sc scope, n int) (release func(), err error) {
	// The admin is not bounded, nor a tenant in an engine namespace of its
	// own (its primary holds no one else's blocks).
	if sc.t == nil || n <= 0 || s.tenancy.ownerOf(ns.name) == sc.t {
		return func() {}, nil
	}
	limit := s.holdLimit(ns, sc.t)
	k := holdKey{sc.t, ns}
	h := &s.holds
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n == nil {
		h.n = map[holdKey]int{}
	}
	if held := h.n[k]; held+n > limit {
		s.metrics.holdRefusals.WithLabelValues(ns.name).Inc()
		return nil, fmt.Errorf("%w: tenant %q keeps %d primary slots in stream requests and may keep %d (its quota less its router pins); %d more refused (finish the requests in flight first)",
			ErrNoSpace, sc.t.name, held, limit, n)
	}
	h.n[k] += n
	var once sync.Once
	return func() {
		once.Do(func() {
			h.mu.Lock()
			defer h.mu.Unlock()
			if h.n[k] -= n; h.n[k] == 0 {
				delete(h.n, k)
			}
		})
	}, nil
}
