// Deferred cascades: a store the pin budget cannot take now waits, as
// keys without pins, in a bounded queue, and is cascaded when the budget
// frees, if its blocks are still in the primary.

package tiering

import "github.com/kvtier/kvtier/offload"

// deferred is one cascade waiting for the pin budget: its keys, the
// request whose store filter it was admitted under, and the tiers (a bit
// per index) it still owes.
type deferred struct {
	keys []offload.Key
	req  *offload.ReqContext
	mask uint64
}

// deferQueue holds the deferred cascades in the order they came. It pins
// nothing: a deferred block keeps its place in the primary's eviction
// order like any other, so deferring never makes the cache worse than
// the primary alone; a block evicted before its turn is dropped then
// (DropEvicted), as the primary alone would have lost it too.
type deferQueue struct {
	q    []deferred
	head int
	keys int // keys queued
	max  int // bound on keys queued; 0: deferral off
	// byReq counts the queued cascades of each request, so that a
	// request's finish looks through the queue only when it has some.
	byReq map[*offload.ReqContext]int
}

func (d *deferQueue) len() int { return len(d.q) - d.head }

func (d *deferQueue) push(e deferred) {
	d.q = append(d.q, e)
	d.keys += len(e.keys)
	if d.byReq == nil {
		d.byReq = make(map[*offload.ReqContext]int)
	}
	d.byReq[e.req]++
}

func (d *deferQueue) pop() deferred {
	e := d.q[d.head]
	d.q[d.head] = deferred{}
	d.head++
	d.keys -= len(e.keys)
	if n := d.byReq[e.req] - 1; n > 0 {
		d.byReq[e.req] = n
	} else {
		delete(d.byReq, e.req)
	}
	switch {
	case d.head == len(d.q):
		d.q, d.head = d.q[:0], 0
	case d.head >= 64 && 2*d.head >= len(d.q):
		// A queue that never empties under steady pressure: move the live
		// entries down, so that its array stays bounded by them.
		n := copy(d.q, d.q[d.head:])
		clear(d.q[n:])
		d.q, d.head = d.q[:n], 0
	}
	return e
}

// deferrable reports whether a cascade dropped for r may wait instead:
// the budget reasons only. Back-pressure and full queues say the tier is
// slow; waiting would only grow a backlog behind it.
func (r DropReason) deferrable() bool {
	return r == DropBudget || r == DropTierBudget || r == DropTenantBudget
}

// canDefer reports whether a cascade of n blocks out of arena a may be
// deferred: deferral re-pins blocks by key through the driver, which only
// the stack's own arena (the primary) allows.
func (s *Stack) canDefer(a offload.Arena, n int) bool {
	return s.dq.max > 0 && a == s.arena && s.dq.keys+n <= s.dq.max
}

// retryDeferred cascades the deferred stores the budget takes now, oldest
// first, and stops at the first it still cannot take (so a large one is
// not starved by smaller ones behind it). Poll calls it after applying
// the step's results, which is when the budget frees.
func (s *Stack) retryDeferred() {
	for s.dq.len() > 0 && !s.closed {
		e := &s.dq.q[s.dq.head]
		_, _, keys, mask := s.cascade(s.arena, e.keys, e.req, e.mask, true)
		if mask != 0 {
			// Still (partly) over budget: it keeps its place at the head.
			s.dq.keys += len(keys) - len(e.keys)
			e.keys, e.mask = keys, mask
			return
		}
		s.dq.pop()
	}
}

// detachDeferred moves req's deferred cascades to a context of their own
// before the tiers hear of req's finish: a tier sees every cascade of a
// request before its end (docs/semantics.md §4.7), and a later one comes under another
// id, with the same filters and params.
func (s *Stack) detachDeferred(req *offload.ReqContext) {
	n := s.dq.byReq[req]
	if n == 0 {
		return
	}
	bg := &offload.ReqContext{
		ID: req.ID + " (deferred)", Params: req.Params, LoadFilter: req.LoadFilter, StoreFilter: req.StoreFilter,
		LoadFromRequest: req.LoadFromRequest, StoreFromRequest: req.StoreFromRequest,
	}
	for i := s.dq.head; i < len(s.dq.q) && n > 0; i++ {
		if e := &s.dq.q[i]; e.req == req {
			e.req = bg
			n--
		}
	}
	s.dq.byReq[bg] = s.dq.byReq[req]
	delete(s.dq.byReq, req)
}

// dropDeferred drops every deferred cascade (a reset dropped their
// blocks, or the stack closes), counted as evicted.
func (s *Stack) dropDeferred() {
	for s.dq.len() > 0 {
		e := s.dq.pop()
		s.countDeferredLost(e.mask, len(e.keys))
	}
}

// countDeferredLost counts blocks of a deferred cascade that left the
// primary before their turn, for every tier it owed them to.
func (s *Stack) countDeferredLost(mask uint64, blocks int) {
	for _, ts := range s.tiers {
		if mask&(1<<ts.idx) != 0 {
			s.countDrop(ts, DropEvicted, blocks)
		}
	}
}

// Deferred returns the cascades waiting for the budget and their blocks.
func (s *Stack) Deferred() (cascades, blocks int) { return s.dq.len(), s.dq.keys }
