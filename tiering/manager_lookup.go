// The manager's lookups, promotions and loads: the primary answers first;
// a miss there asks the stack, and a hit in a secondary tier reserves a
// slot and queues its promotion, submitted per tier and request at the
// step's end; a load pins primary blocks until it completes.

package tiering

import (
	"fmt"
	"slices"

	"github.com/kvtier/kvtier/offload"
)

// promoQueue holds one tier's promotions of the current step; n of its
// batches are in use.
type promoQueue struct {
	batches []promoBatch
	n       int
}

type promoBatch struct {
	req   *offload.ReqContext
	keys  []offload.Key
	slots []int64
}

// Source names where key's block is coming from, for tools: PrimaryName
// when it is ready in the primary, the secondary tier a promotion of it
// is loading it from, or "" (absent, or pending for another reason). It
// does not count as a lookup. It scans the step's promotions and the jobs
// in flight: not for the hot path.
func (m *Manager) Source(key offload.Key) string {
	if ref, ok := m.primary.RefCount(key); ok && ref >= 0 {
		return PrimaryName
	}
	for i := range m.promos {
		q := &m.promos[i]
		for _, b := range q.batches[:q.n] {
			if slices.Contains(b.keys, key) {
				return m.stack.tiers[i].name
			}
		}
	}
	name, _ := m.stack.PromotionSource(key)
	return name
}

// Lookup answers whether key can be loaded for req (§4.3). The primary is
// asked first and is never filtered; then each secondary tier the
// request's load filter allows, in order; a tier the filter excludes is
// not called. The first secondary Hit reserves a primary slot and queues a
// promotion, answering Retry (or HitPending, see Config); a full primary
// answers Miss.
func (m *Manager) Lookup(key offload.Key, req *offload.ReqContext) offload.LookupResult {
	if !m.polled {
		if m.closed {
			return offload.Miss
		}
		m.poll()
	}
	if r := m.primary.Lookup(key); r == offload.Hit || r == offload.HitPending {
		if r == offload.Hit && len(m.prefetch.holds) > 0 {
			m.releaseHold(key) // found: its reader pins it now
		}
		return r
	}
	return m.lookupSecondary(key, m.ctx(req))
}

// LookupPrefix looks keys up in order like the connector's prefix scan
// (§7.G): Hit counts; HitPending counts but defers; Retry stops the count
// but the scan continues so that later keys start their checks and
// promotions; the first Miss stops the scan. out, when long enough,
// receives each key's answer (Miss for keys not scanned). It returns the
// number of consecutive hits from the first key.
//
// A promotion started for a later key may evict a block that answered Hit
// earlier in the same scan; such a key is reported Retry instead (and the
// count ends before it), so that every key counted as a hit is present
// when LookupPrefix returns.
func (m *Manager) LookupPrefix(keys []offload.Key, req *offload.ReqContext, out []offload.LookupResult) (hits int) {
	if !m.polled {
		if m.closed {
			clear(out)
			return 0
		}
		m.poll()
	}
	req = m.ctx(req)
	started := m.promotions
	counting := true
	scanned := len(keys)
	for i, k := range keys {
		r := m.primary.Lookup(k)
		if r == offload.Hit && len(m.prefetch.holds) > 0 {
			m.releaseHold(k) // found: its reader pins it now
		} else if r != offload.Hit && r != offload.HitPending {
			r = m.lookupSecondary(k, req)
		}
		if i < len(out) {
			out[i] = r
		}
		if r == offload.Hit || r == offload.HitPending {
			if counting {
				hits++
			}
			continue
		}
		if r == offload.Retry {
			counting = false
			continue
		}
		scanned = i + 1
		if scanned < len(out) {
			clear(out[scanned:])
		}
		break
	}
	if m.promotions != started {
		hits = m.recheckHits(keys[:scanned], out, hits)
	}
	return hits
}

// recheckHits demotes to Retry the keys of a scan that answered Hit but
// were evicted since by a promotion of the same scan, and returns the
// corrected hit count.
func (m *Manager) recheckHits(keys []offload.Key, out []offload.LookupResult, hits int) int {
	for i, k := range keys {
		if i < len(out) && out[i] != offload.Hit {
			continue
		}
		if i >= len(out) && i >= hits {
			break
		}
		ref, present := m.primary.RefCount(k)
		switch {
		case present && ref >= 0:
			continue
		case present: // evicted, then reserved again by this scan
			if i < len(out) {
				out[i] = offload.HitPending
			}
			continue
		}
		if i < len(out) {
			out[i] = offload.Retry
		}
		hits = min(hits, i)
	}
	return hits
}

func (m *Manager) lookupSecondary(key offload.Key, req *offload.ReqContext) offload.LookupResult {
	r, i := m.stack.Lookup(key, req)
	if r == offload.Hit {
		return m.promote(i, key, req)
	}
	return r
}

// promote reserves a primary slot for key and queues its load from ts in
// this step's batch for (ts, req) (§4.4).
func (m *Manager) promote(i int, key offload.Key, req *offload.ReqContext) offload.LookupResult {
	ts := m.stack.tiers[i]
	m.one[0] = key
	out := &m.promoOut
	// Queued cascades give way (Stack.Revoke): promotions are never
	// refused because of cascades.
	ok := m.primary.PrepareStoreInto(m.one[:], out)
	if !ok && m.prefetch.byReq[req] == nil && m.yieldHolds() {
		// Blocks held for prefetches give way to the engine's promotions.
		ok = m.primary.PrepareStoreInto(m.one[:], out)
	}
	m.one[0] = ""
	if !ok {
		ts.stats.PromotionsRejected++
		return offload.Miss
	}
	if len(out.KeysToStore) == 0 {
		// Present after all (cannot happen after a primary Miss).
		return offload.HitPending
	}
	b := m.promos[i].batch(req)
	b.keys = append(b.keys, out.KeysToStore...)
	b.slots = append(b.slots, out.Slots...)
	m.pendingPromos += len(out.KeysToStore)
	clear(out.KeysToStore) // the scratch must not keep keys alive
	clear(out.Evicted)
	m.promotions++
	ts.stats.PromotionsStarted++
	if m.hitPending {
		return offload.HitPending
	}
	return offload.Retry
}

// batch returns this step's promotion batch of req, creating it. The
// batch keeps the first context seen for the request in the step.
func (q *promoQueue) batch(req *offload.ReqContext) *promoBatch {
	for i := range q.batches[:q.n] {
		if b := &q.batches[i]; b.req == req || b.req.ID == req.ID {
			return b
		}
	}
	if q.n == len(q.batches) {
		q.batches = append(q.batches, promoBatch{})
	}
	b := &q.batches[q.n]
	q.n++
	b.req = req
	return b
}

// PrepareLoad pins keys in the primary for a load to the engine; keys must
// be Hit there. Slots are co-indexed with keys.
func (m *Manager) PrepareLoad(keys []offload.Key, req *offload.ReqContext) ([]int64, error) {
	if m.closed {
		return nil, ErrClosed
	}
	slots, err := m.primary.PrepareLoad(keys)
	if err != nil {
		return nil, fmt.Errorf("tiering: prepare load for request %q: %w", m.ctx(req).ID, err)
	}
	return slots, nil
}

// PrepareLoadPresent pins the keys still readable in the primary and
// answers slot -1 for the others (evicted or rewritten since the lookup
// that answered Hit); missing counts them. See cpu.Primary.PrepareLoadPresent.
func (m *Manager) PrepareLoadPresent(keys []offload.Key) (slots []int64, missing int, err error) {
	if m.closed {
		return nil, 0, ErrClosed
	}
	slots, missing = m.primary.PrepareLoadPresent(keys)
	return slots, missing, nil
}

// SlotGen returns how many blocks the primary's slot has been given
// (cpu.Primary.SlotGen): what a reader that derived something from a
// block's bytes keys it by.
func (m *Manager) SlotGen(slot int64) uint16 { return m.primary.SlotGen(slot) }

// Touch refreshes recency in the primary and in every secondary tier (not
// filtered: recency is not a load).
func (m *Manager) Touch(keys []offload.Key, req *offload.ReqContext) {
	if m.closed {
		return
	}
	req = m.ctx(req)
	m.primary.Touch(keys)
	m.stack.Touch(keys, req)
}

// CompleteLoad unpins keys pinned by PrepareLoad.
func (m *Manager) CompleteLoad(keys []offload.Key, req *offload.ReqContext) error {
	if m.closed {
		return ErrClosed
	}
	if err := m.primary.CompleteLoad(keys); err != nil {
		return fmt.Errorf("tiering: complete load for request %q: %w", m.ctx(req).ID, err)
	}
	return nil
}

// flushPromotions submits one load job per (tier, request) batch.
func (m *Manager) flushPromotions() {
	if m.pendingPromos == 0 {
		return
	}
	for i := range m.promos {
		q := &m.promos[i]
		for j := range q.batches[:q.n] {
			b := &q.batches[j]
			m.stack.Load(i, b.keys, b.slots, b.req)
			*b = promoBatch{}
		}
		q.n = 0
	}
	m.pendingPromos = 0
}

// flushPromotionsOf submits req's promotions of this step now, leaving
// the other requests' for the step's end.
func (m *Manager) flushPromotionsOf(req *offload.ReqContext) {
	for i := range m.promos {
		q := &m.promos[i]
		for j := 0; j < q.n; j++ {
			b := &q.batches[j]
			if b.req != req {
				continue
			}
			m.stack.Load(i, b.keys, b.slots, b.req)
			m.pendingPromos -= len(b.keys)
			// The last batch in use takes its place.
			q.n--
			q.batches[j], q.batches[q.n] = q.batches[q.n], promoBatch{}
			j--
		}
	}
}

// dropPromotions forgets the step's unsubmitted promotions; release
// frees their reserved slots.
func (m *Manager) dropPromotions(release bool) {
	for i := range m.promos {
		q := &m.promos[i]
		for j := range q.batches[:q.n] {
			b := &q.batches[j]
			if release {
				m.primary.CompleteStore(b.keys, false)
			}
			*b = promoBatch{}
		}
		q.n = 0
	}
	m.pendingPromos = 0
}
