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
// of the keys that reuse the capacity.
func (p *Primary) PrepareStore(keys []offload.Key) (out offload.PrepareStoreOutput, ok bool) {
	if p.reuse != nil {
		keys = p.filterReused(keys)
	}
	epoch := p.nextEpoch()
	d := newKeyDedup(p, len(keys))
	if len(p.newKeys) > maxScratchKeys {
		// Drop a large batch's scratch rather than keep its keys alive.
		p.newKeys, p.newHash = nil, nil
	}
	p.newKeys, p.newHash = p.newKeys[:0], p.newHash[:0]
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
		return offload.PrepareStoreOutput{}, true
	}
	p.recordAllocation(n)

	p.victims = p.victims[:0]
	if need := n - len(p.free) - int(p.numSlots-p.numAllocated); need > 0 {
		if need > p.numEvictable {
			p.ctr.rejectedStores++
			return offload.PrepareStoreOutput{}, false
		}
		var ok bool
		if p.victims, ok = p.pol.evict(need, epoch, p.victims); !ok {
			p.ctr.rejectedStores++
			return offload.PrepareStoreOutput{}, false
		}
	}

	// One allocation backs both key lists; capacities are clipped so that
	// appending to one cannot overwrite the other.
	ev := len(p.victims)
	buf := make([]offload.Key, n+ev)
	out.KeysToStore = buf[:n:n]
	copy(out.KeysToStore, p.newKeys)
	out.Slots = make([]int64, n)
	if ev > 0 {
		out.Evicted = buf[n : n+ev : n+ev]
		for i, s := range p.victims {
			m := &p.b.meta[s]
			out.Evicted[i] = m.key
			p.b.index.remove(uint64(m.h32), s)
			m.free()
			p.free = append(p.free, s)
		}
		p.numEvictable -= len(p.victims)
		p.numBlocks -= len(p.victims)
		p.ctr.evictions += uint64(len(p.victims))
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
			s = p.free[len(p.free)-1]
			p.free = p.free[:len(p.free)-1]
		}
		h := p.newHash[i]
		// Field by field: a whole-struct store of a pointerful type costs
		// a bulk write barrier while the GC runs.
		m := &p.b.meta[s]
		m.key, m.ref, m.mark, m.h32 = k, -1, epoch, uint32(h)
		p.b.index.insert(h, s)
		p.pol.inserted(s, h)
		out.Slots[i] = int64(s)
	}
	p.numBlocks += n
	p.numPending += n
	return out, true
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
// way, so a failed job never destroys a block stored before it.
func (p *Primary) CompleteStore(keys []offload.Key, success bool) {
	var stored []offload.Key
	for _, k := range keys {
		h := p.b.hash(k)
		s := p.b.find(k, h)
		if s < 0 || p.b.meta[s].ref != -1 {
			continue
		}
		p.numPending--
		if success {
			p.b.meta[s].ref = 0
			p.numEvictable++
			p.pol.becameEvictable(s)
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
		p.b.index.remove(h, s)
		p.b.meta[s].free()
		p.free = append(p.free, s)
		p.numBlocks--
		p.ctr.failedStores++
	}
	if len(stored) > 0 {
		p.evs = append(p.evs, offload.Event{Keys: stored, Medium: offload.MediumCPU})
	}
}

// Reset drops every block whatever its state, frees every slot and clears
// the policy, emitting no event. Buffered events, the cumulative counters
// of Stats and the reuse filter's lookup counts are kept. Completions of jobs started before a reset
// must not reach the tier (the caller discards them).
func (p *Primary) Reset() {
	for i := range p.numAllocated {
		p.b.meta[i] = slotMeta{}
		p.b.links[i] = link{-1, -1}
	}
	p.b.index.clear()
	p.free = p.free[:0]
	p.numAllocated = 0
	p.numBlocks, p.numPending, p.numEvictable = 0, 0, 0
	p.pol.clear()
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
