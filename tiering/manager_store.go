// The manager's stores: reservations in the primary (PrepareStore,
// CompleteStore) or an engine's leased slots bound to their keys (Lease,
// Bind, Unlease); a completed store cascades to the secondary tiers.

package tiering

import (
	"fmt"
	"slices"

	"github.com/kvtier/kvtier/cpu"
	"github.com/kvtier/kvtier/offload"
)

// PrepareStore reserves primary slots for the keys not yet stored (§4.6).
// ok is false when the primary cannot make room (nothing changed). For a
// request with request-level tiers, keys already ready in the primary are
// cascaded to those tiers at once. The output's slices are new and belong
// to the caller.
func (m *Manager) PrepareStore(keys []offload.Key, req *offload.ReqContext) (offload.PrepareStoreOutput, bool, error) {
	var out offload.PrepareStoreOutput
	ok, err := m.prepareStore(keys, req, &out, false)
	if !ok {
		out = offload.PrepareStoreOutput{}
	}
	return out, ok, err
}

// PrepareStoreInto is PrepareStore writing its output into out like
// cpu.Primary.PrepareStoreInto: out's slices are reused when large enough,
// so a caller that encodes the output and keeps one PrepareStoreOutput for
// the next call stores without allocating. On !ok or an error out's
// slices are empty.
func (m *Manager) PrepareStoreInto(keys []offload.Key, req *offload.ReqContext, out *offload.PrepareStoreOutput) (bool, error) {
	out.KeysToStore, out.Slots, out.Evicted = out.KeysToStore[:0], out.Slots[:0], out.Evicted[:0]
	return m.prepareStore(keys, req, out, true)
}

func (m *Manager) prepareStore(keys []offload.Key, req *offload.ReqContext, out *offload.PrepareStoreOutput, reuse bool) (bool, error) {
	if m.closed {
		return false, ErrClosed
	}
	req = m.ctx(req)
	rs, ok := m.reqs[req.ID]
	if !ok {
		return false, fmt.Errorf("%w %q: prepare store", ErrUnknownRequest, req.ID)
	}
	if rs.finished {
		return false, fmt.Errorf("%w: %q: prepare store", ErrRequestFinished, req.ID)
	}
	if !m.polled {
		m.poll() // completions free pinned blocks before eviction decisions
	}
	// Stores win over queued cascades: eviction withdraws those of the
	// blocks it takes (Stack.Revoke).
	if ok = m.primaryStore(keys, out, reuse); !ok {
		return false, nil
	}
	rs.pendingStores += len(out.KeysToStore)
	if rs.requestLevel != 0 {
		if existing := m.readyNotStored(keys, out.KeysToStore); len(existing) > 0 {
			m.stack.Cascade(existing, req, rs.requestLevel)
		}
	}
	return true, nil
}

func (m *Manager) primaryStore(keys []offload.Key, out *offload.PrepareStoreOutput, reuse bool) (ok bool) {
	for {
		if reuse {
			ok = m.primary.PrepareStoreInto(keys, out)
		} else {
			*out, ok = m.primary.PrepareStore(keys)
		}
		// Blocks held for prefetches give way to the engine's stores.
		if ok || !m.yieldHolds() {
			return ok
		}
	}
}

// readyNotStored returns the keys that PrepareStore did not take (they
// were present) and that are ready in the primary.
func (m *Manager) readyNotStored(keys, toStore []offload.Key) []offload.Key {
	var out []offload.Key
	j := 0
	for _, k := range keys {
		if j < len(toStore) && toStore[j] == k {
			j++ // keys_to_store is keys filtered in order
			continue
		}
		if m.ready(k) {
			out = append(out, k)
		}
	}
	return out
}

// ready reports whether k is ready (readable) in the primary, without
// counting as a lookup in its metrics.
func (m *Manager) ready(k offload.Key) bool {
	ref, ok := m.primary.RefCount(k)
	return ok && ref >= 0
}

// CompleteStore commits (success) or releases the slots reserved by
// PrepareStore. On success the keys are cascaded to every secondary tier
// the request's store filter allows and that is not under back-pressure; a
// failed store cascades nowhere. The slots are resolved even when the
// request is unknown (then nothing is cascaded and ErrUnknownRequest is
// returned).
func (m *Manager) CompleteStore(keys []offload.Key, req *offload.ReqContext, success bool) error {
	if m.closed {
		return ErrClosed
	}
	req = m.ctx(req)
	resolved := m.primary.CompleteStore(keys, success)
	rs, ok := m.reqs[req.ID]
	if !ok {
		return fmt.Errorf("%w %q: complete store", ErrUnknownRequest, req.ID)
	}
	if success && len(keys) > 0 && m.stack.Len() > 0 {
		m.stack.Cascade(slices.Clone(keys), req, ^uint64(0))
	}
	// Counted in keys, not calls: a client may complete a reservation in
	// parts, or abandon several PrepareStores with one call (a session's
	// release does), and the request must finalize exactly when its last
	// reserved slot is resolved.
	rs.pendingStores -= min(resolved, rs.pendingStores)
	m.maybeFinalize(rs)
	return nil
}

// Lease reserves up to n primary slots for an engine that assigns its
// store slots itself (vLLM manager mode): see cpu.Primary.Lease. Finished
// jobs are polled first, so that their pins do not keep blocks from being
// evicted for the lease.
func (m *Manager) Lease(n int) (slots []int64, evicted []offload.Key, err error) {
	if m.closed {
		return nil, nil, ErrClosed
	}
	if !m.polled {
		m.poll()
	}
	slots, evicted = m.primary.Lease(n)
	if len(slots) < n && m.yieldHolds() {
		// Blocks held for prefetches give way to the engine's stores.
		more, ev := m.primary.Lease(n - len(slots))
		slots, evicted = append(slots, more...), append(evicted, ev...)
	}
	return slots, evicted, nil
}

// Bind commits an engine's stores into its leased slots: with success,
// each slots[i] becomes keys[i]'s ready block (a copy of a key already
// present is dropped and its slot freed) and the blocks bound cascade to
// the secondary tiers the request's store filter allows, as CompleteStore
// cascades; without success the slots go back to the free list. It
// returns the number of blocks bound.
func (m *Manager) Bind(keys []offload.Key, slots []int64, req *offload.ReqContext, success bool) (int, error) {
	if m.closed {
		return 0, ErrClosed
	}
	if len(keys) != len(slots) {
		return 0, fmt.Errorf("tiering: bind %d keys to %d slots", len(keys), len(slots))
	}
	for _, s := range slots {
		if !m.primary.Leased(s) {
			return 0, fmt.Errorf("tiering: bind: slot %d: %w", s, cpu.ErrNotLeased)
		}
	}
	if !success {
		return 0, m.primary.Unlease(slots)
	}
	if !m.polled {
		// Finished cascades release their pins first, so that the
		// budget admits this batch's cascade against the cascades still
		// in flight, not against ones that ended since the last step (an
		// engine that stores in bursts, as SGLang's backup thread does,
		// would see every other burst dropped).
		m.poll()
	}
	req = m.ctx(req)
	var bound []offload.Key
	for i, s := range slots {
		ok, err := m.primary.Bind(s, keys[i])
		if err != nil {
			// Checked above: cannot happen; the slots left stay leased.
			return len(bound), err
		}
		if ok {
			bound = append(bound, keys[i])
		}
	}
	if len(bound) > 0 && m.stack.Len() > 0 {
		m.stack.Cascade(bound, req, ^uint64(0))
	}
	return len(bound), nil
}

// Unlease gives leased slots back (cpu.Primary.Unlease).
func (m *Manager) Unlease(slots []int64) error {
	if m.closed {
		return ErrClosed
	}
	return m.primary.Unlease(slots)
}

func (m *Manager) readyKeys(keys []offload.Key) []offload.Key {
	var out []offload.Key
	for _, k := range keys {
		if m.ready(k) {
			out = append(out, k)
		}
	}
	return out
}
