package cpu

import (
	"fmt"
	"slices"

	"github.com/kvtier/kvtier/offload"
)

// Slot leases (vLLM manager mode). An engine that assigns store slots
// itself, without a round trip per store, holds a pool of leased slots: a
// leased slot belongs to no key, is neither free nor evictable, and is the
// engine's to write. Bind later names the key the engine wrote into it
// (the block becomes ready) or Unlease gives it back.
//
// A leased slot's meta has key "" and ref refLeased: the index never sees
// it, so no lookup finds it, and Reset, which frees only unheld keyed
// blocks, leaves it alone.

const refLeased = -2

// Lease reserves up to n slots for the caller to write, evicting settled
// blocks in eviction order when free slots are short; it returns the slots
// and the keys it evicted. Unlike PrepareStore it never revokes a
// cascade in flight. It leases fewer than n when eviction cannot make room
// for all (blocks pinned, pending or being cascaded).
func (p *Primary) Lease(n int) (slots []int64, evicted []offload.Key) {
	if n <= 0 {
		return nil, nil
	}
	free := p.numFree + int(p.numSlots-p.numAllocated)
	if need := n - free; need > 0 {
		// Only settled blocks make room for a lease, never blocks a tier
		// is still copying: a lease reserves room for stores that may
		// never come, and revoking a cascade for it would lose a block
		// the tier was about to hold, for nothing. PrepareStore, a store
		// that is happening, may revoke.
		avail := p.numEvictable
		if need > avail {
			need = avail
		}
		if need > 0 {
			epoch := p.nextEpoch()
			p.victims = p.victims[:0]
			p.storing("")
			var ok bool
			p.victims, ok = p.pol.evict(need, epoch, p.victims, neverRevoke)
			if !ok {
				p.victims = p.victims[:0]
			}
			for _, s := range p.victims {
				m := &p.b.meta[s]
				evicted = append(evicted, m.key)
				p.disown(s)
				p.b.index.remove(m.h32, s)
				m.free()
				p.pushFree(s)
			}
			if ev := len(p.victims); ev > 0 {
				p.numEvictable -= ev
				p.numBlocks -= ev
				p.ctr.evictions += uint64(ev)
				if p.events {
					p.evs = append(p.evs, offload.Event{Keys: slices.Clone(evicted), Medium: offload.MediumCPU, Removed: true})
				}
			}
		}
		n = min(n, p.numFree+int(p.numSlots-p.numAllocated))
	}
	slots = make([]int64, 0, n)
	for range n {
		var s int32
		if p.numAllocated < p.numSlots {
			s = p.numAllocated
			p.numAllocated++
		} else {
			s = p.popFree()
		}
		m := &p.b.meta[s]
		m.key, m.ref = "", refLeased
		p.own(s, "") // the untagged pool's until Bind names its key
		slots = append(slots, int64(s))
	}
	p.numLeased += n
	return slots, evicted
}

func neverRevoke(int32) bool { return false }

// Leased reports whether slot is leased.
func (p *Primary) Leased(slot int64) bool {
	return slot >= 0 && slot < int64(p.numSlots) && p.b.meta[slot].ref == refLeased
}

// Bind names the block the lease holder wrote into a leased slot: it
// becomes key's ready block (most recently used), announced by a stored
// event. When key is already present (another copy was stored meanwhile)
// the slot is freed instead and Bind reports false. A slot that is not
// leased is an error.
func (p *Primary) Bind(slot int64, key offload.Key) (bool, error) {
	if !p.Leased(slot) {
		return false, fmt.Errorf("cpu: bind slot %d: %w", slot, ErrNotLeased)
	}
	if !key.Valid() {
		return false, fmt.Errorf("cpu: bind slot %d: %w", slot, offload.ErrInvalidKey)
	}
	s := int32(slot)
	m := &p.b.meta[s]
	p.numLeased--
	p.disown(s)
	h := p.b.hash(key)
	if p.b.find(key, h) >= 0 {
		m.free()
		p.pushFree(s)
		return false, nil
	}
	m.key, m.ref, m.mark = key, 0, p.epoch
	p.b.gen[s]++
	p.b.add(s, h)
	p.own(s, key)
	if p.listsPending {
		p.pol.inserted(s)
	}
	p.numBlocks++
	p.numEvictable++
	p.becameEvictable(s)
	p.ctr.storedBlocks++
	if p.events {
		p.evs = append(p.evs, offload.Event{Keys: []offload.Key{key}, Medium: offload.MediumCPU})
	}
	return true, nil
}

// Unlease returns leased slots to the free list. A slot that is not
// leased is an error, and nothing is freed.
func (p *Primary) Unlease(slots []int64) error {
	const seen = refLeased - 1 // marks a slot listed twice
	for i, s := range slots {
		if !p.Leased(s) {
			for _, u := range slots[:i] {
				p.b.meta[u].ref = refLeased
			}
			return fmt.Errorf("cpu: unlease slot %d: %w", s, ErrNotLeased)
		}
		p.b.meta[s].ref = seen
	}
	for _, s := range slots {
		p.disown(int32(s))
		p.b.meta[s].free()
		p.pushFree(int32(s))
	}
	p.numLeased -= len(slots)
	return nil
}
