package cpu

import (
	"slices"

	"github.com/kvtier/kvtier/offload"
)

// dedupMapMin is the batch size from which PrepareStore finds repeated new
// keys with a map rather than by scanning the keys collected so far.
const dedupMapMin = 64

// maxScratchKeys bounds the new-key scratch kept between PrepareStore
// calls; it holds references to the caller's keys.
const maxScratchKeys = 256

// PrepareStore reserves slots for the keys that are not present yet
// (pending keys count as present: an in-flight store is not duplicated),
// evicting ready, unpinned blocks if it must. Keys of this call, already
// present ones included, are never evicted by it. New keys become pending
// (ref −1) until CompleteStore.
//
// ok is false, with no state change at all, when there is not enough
// evictable capacity. When every key is present the output is empty and
// ok is true. Eviction appends one removed event before any stored event
// of the keys that reuse the capacity. The output's slices are new and
// belong to the caller; PrepareStoreInto reuses the caller's instead.
func (p *Primary) PrepareStore(keys []offload.Key) (out offload.PrepareStoreOutput, ok bool) {
	if !p.prepareStore(keys, &out, false) {
		return offload.PrepareStoreOutput{}, false
	}
	return out, true
}

// PrepareStoreInto is PrepareStore writing its output into out, whose
// slices are truncated and reused when their capacity suffices (grown
// otherwise), so that a caller that keeps one PrepareStoreOutput across
// calls stores without allocating. On ok false, or when every key is
// present, out's slices are left empty.
func (p *Primary) PrepareStoreInto(keys []offload.Key, out *offload.PrepareStoreOutput) (ok bool) {
	out.KeysToStore, out.Slots, out.Evicted = out.KeysToStore[:0], out.Slots[:0], out.Evicted[:0]
	return p.prepareStore(keys, out, true)
}

// sizeOutput gives out room for n new keys and ev evicted ones: new
// slices (one allocation backs both key lists, capacities clipped so that
// appending to one cannot overwrite the other), or out's own grown when
// reuse is set.
func sizeOutput(out *offload.PrepareStoreOutput, n, ev int, reuse bool) {
	if reuse {
		out.KeysToStore = slices.Grow(out.KeysToStore, n)[:n]
		out.Slots = slices.Grow(out.Slots, n)[:n]
		out.Evicted = slices.Grow(out.Evicted, ev)[:ev]
		return
	}
	buf := make([]offload.Key, n+ev)
	out.KeysToStore = buf[:n:n]
	out.Slots = make([]int64, n)
	if ev > 0 {
		out.Evicted = buf[n : n+ev : n+ev]
	}
}

// prepareStore does PrepareStore's work, writing the results into out
// (sized by sizeOutput). On success newKeys and newSlots hold the reserved
// keys and their slots for hint; on failure nothing changed, out is left
// as it was and newKeys is empty.
func (p *Primary) prepareStore(keys []offload.Key, out *offload.PrepareStoreOutput, reuse bool) bool {
	if p.reuse != nil {
		keys = p.filterReused(keys)
	}
	epoch := p.nextEpoch()
	d := newKeyDedup(p, len(keys))
	if cap(p.newKeys) > maxScratchKeys {
		// Drop a large batch's scratch rather than keep its keys alive.
		p.newKeys, p.newHash, p.newSlots = nil, nil, nil
	}
	p.newKeys, p.newHash, p.newSlots = p.newKeys[:0], p.newHash[:0], p.newSlots[:0]
	p.victims = p.victims[:0]
	for _, k := range keys {
		h := p.b.hash(k)
		if s := p.b.find(k, h); s >= 0 {
			p.b.meta[s].mark = epoch // protected from this call's eviction
			continue
		}
		if d.repeated(p, k, h) {
			continue
		}
		p.newKeys = append(p.newKeys, k)
		p.newHash = append(p.newHash, h)
	}
	n := len(p.newKeys)
	if n == 0 {
		return true
	}
	p.recordAllocation(n)

	if need := n - p.numFree - int(p.numSlots-p.numAllocated); need > 0 {
		p.storing(p.newKeys[0])
		var ok bool
		if need <= p.numEvictable || p.revoker != nil && need <= p.numEvictable+p.numRevocable {
			p.victims, ok = p.pol.evict(need, epoch, p.victims, p.revokeFn)
		}
		if !ok {
			p.ctr.rejectedStores++
			p.newKeys = p.newKeys[:0]
			return false
		}
	}
	sizeOutput(out, n, len(p.victims), reuse)
	for i, s := range p.victims {
		m := &p.b.meta[s]
		out.Evicted[i] = m.key
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
			p.evs = append(p.evs, offload.Event{Keys: slices.Clone(out.Evicted), Medium: offload.MediumCPU, Removed: true})
		}
	}

	// Fresh slots in ascending order first, then freed ones, last freed
	// first.
	for i, k := range p.newKeys {
		var s int32
		if p.numAllocated < p.numSlots {
			s = p.numAllocated
			p.numAllocated++
		} else {
			s = p.popFree()
		}
		// Field by field: a whole-struct store of a pointerful type costs
		// a bulk write barrier while the GC runs.
		m := &p.b.meta[s]
		m.key, m.ref, m.mark = k, -1, epoch
		p.b.gen[s]++
		p.b.add(s, p.newHash[i])
		p.own(s, k)
		if p.listsPending {
			p.pol.inserted(s) // LRU does not list pending blocks
		}
		p.newSlots = append(p.newSlots, s)
		out.KeysToStore[i], out.Slots[i] = k, int64(s)
	}
	p.numBlocks += n
	p.numPending += n
	return true
}

// pushFree and popFree keep the free slots as a stack chained through
// links.next.
func (p *Primary) pushFree(s int32) {
	p.b.links[s].next = p.freeHead
	p.freeHead = s
	p.numFree++
}

func (p *Primary) popFree() int32 {
	s := p.freeHead
	p.freeHead = p.b.links[s].next
	p.b.links[s].next = -1
	p.numFree--
	return s
}

// hint resolves the key at position *j of the last prepared batch when it
// is k, advancing *j, and confirms that the slot still holds k: callers
// that pass the batch back (CompleteStore, then the manager's cascade
// PrepareLoad) skip hashing. It returns -1 when k is not next in the batch
// or no longer in its slot; the caller then looks k up.
func (p *Primary) hint(k offload.Key, j *int) int32 {
	i := *j
	if i >= len(p.newSlots) || !sameKey(p.newKeys[i], k) {
		return -1
	}
	*j = i + 1
	s := p.newSlots[i]
	if p.b.meta[s].key != k {
		s = -1
	}
	return s
}

// keyDedup finds keys repeated among the new keys of one PrepareStore.
// Small batches use a 256-bit filter of hash bits and scan the keys
// collected so far only when the filter says maybe; large ones use a map.
type keyDedup struct {
	useMap bool
	filter [4]uint64
}

func newKeyDedup(p *Primary, n int) keyDedup {
	d := keyDedup{useMap: n >= dedupMapMin}
	if d.useMap {
		if p.seen == nil {
			p.seen = make(map[uint64]int32, n)
		}
		clear(p.seen)
	}
	return d
}

// filterReused drops the keys looked up fewer than StoreThreshold times;
// the rest are this call's keys from then on, protection included.
func (p *Primary) filterReused(keys []offload.Key) []offload.Key {
	if cap(p.reused) > maxScratchKeys {
		p.reused = nil // do not keep a large batch's keys alive
	}
	p.reused = p.reused[:0]
	for _, k := range keys {
		if p.reuse.reused(p.b.hash(k)) {
			p.reused = append(p.reused, k)
		}
	}
	p.ctr.skippedStores += uint64(len(keys) - len(p.reused))
	return p.reused
}

// repeated reports whether k (hash h) was already collected as new in
// this call; if not, it records it.
func (d *keyDedup) repeated(p *Primary, k offload.Key, h uint64) bool {
	if d.useMap {
		j, found := p.seen[h]
		if !found {
			p.seen[h] = int32(len(p.newKeys))
			return false
		}
		if p.newKeys[j] == k {
			return true
		}
		// Two keys with one 64-bit hash: settle it by scanning.
	} else {
		bit := h >> 56 // the index uses the low bits; use the high ones
		w, m := bit>>6, uint64(1)<<(bit&63)
		if d.filter[w]&m == 0 {
			d.filter[w] |= m
			return false
		}
	}
	for j, h2 := range p.newHash {
		if h2 == h && p.newKeys[j] == k {
			return true
		}
	}
	return false
}

// CompleteStore ends the stores of keys. On success each pending key
// becomes ready and evictable (most recently used) and one stored event
// lists them; on failure each pending key is dropped and its slot freed,
// with no event. Keys that are absent or already ready are ignored either
// way, so a failed job never destroys a block stored before it. It
// returns how many pending keys it resolved.
func (p *Primary) CompleteStore(keys []offload.Key, success bool) (resolved int) {
	var stored []offload.Key
	j := 0
	for _, k := range keys {
		s := p.hint(k, &j)
		if s < 0 {
			s = p.b.lookup(k)
		}
		if s < 0 || p.b.meta[s].ref != -1 {
			continue
		}
		p.numPending--
		resolved++
		if success {
			p.b.meta[s].ref = 0
			p.numEvictable++
			p.becameEvictable(s)
			p.ctr.storedBlocks++
			if p.events {
				if stored == nil {
					stored = make([]offload.Key, 0, len(keys))
				}
				stored = append(stored, k)
			}
			continue
		}
		p.pol.removed(s)
		p.disown(s)
		p.b.index.remove(p.b.meta[s].h32, s)
		p.b.meta[s].free()
		p.pushFree(s)
		p.numBlocks--
		p.ctr.failedStores++
	}
	if len(stored) > 0 {
		p.evs = append(p.evs, offload.Event{Keys: stored, Medium: offload.MediumCPU})
	}
	return resolved
}

// Reset drops every block no one holds: ready blocks without pins, and
// the policy's history (ARC's ghosts), emitting no event. A block that is
// pinned (a reader, or a cascade) or pending (a store in flight) stays as
// it is, with its slot and its claims: the arena is shared with engines
// and tier workers, so freeing a slot someone still reads or writes would
// let its next owner's bytes be read as another key's, or a stale write
// land in another key's block. Its holder completes it as usual. Buffered
// events, the cumulative counters of Stats and the reuse filter's lookup
// counts are kept.
func (p *Primary) Reset() {
	for s := range p.numAllocated {
		m := &p.b.meta[s]
		if m.key == "" || m.ref != 0 {
			continue // free, or held
		}
		p.dropSlot(s)
	}
	clear(p.newKeys) // forget the last batch (and its keys)
	p.newKeys, p.newSlots = p.newKeys[:0], p.newSlots[:0]
	p.pol.forgetHistory()
}

// TakeEvents returns the buffered events in the order they happened and
// clears the buffer; nil when events are disabled or none happened.
func (p *Primary) TakeEvents() []offload.Event {
	evs := p.evs
	p.evs = nil
	return evs
}

// Close releases the arena. Slot views must no longer be used; the
// bookkeeping keeps working but the arena reports errors.
func (p *Primary) Close() error { return p.arena.Close() }

// Remove drops the blocks of keys that nothing holds (no load pin, no
// cascade reading them, not pending) and publishes their removal, as an
// eviction does. It returns how many it removed and how many it left
// because something holds them; absent keys count in neither.
func (p *Primary) Remove(keys []offload.Key) (removed, held int) {
	var gone []offload.Key
	for _, k := range keys {
		s := p.b.lookup(k)
		if s < 0 {
			continue
		}
		if p.b.meta[s].ref != 0 {
			held++
			continue
		}
		p.dropSlot(s)
		gone = append(gone, k)
	}
	if len(gone) > 0 && p.events {
		p.evs = append(p.evs, offload.Event{Keys: gone, Medium: offload.MediumCPU, Removed: true})
	}
	return len(gone), held
}

// dropSlot frees the unheld, ready block in slot s (Reset, Remove): out of
// the policy, its owner's share and the index, the slot back on the free
// list.
func (p *Primary) dropSlot(s int32) {
	m := &p.b.meta[s]
	p.pol.removed(s)
	p.disown(s)
	p.b.index.remove(m.h32, s)
	m.free()
	p.pushFree(s)
	p.numBlocks--
	p.numEvictable--
}
