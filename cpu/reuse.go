package cpu

// DefaultReuseTrackerSize is the number of keys whose lookup counts the
// reuse filter remembers when Config.ReuseTrackerSize is 0 (vLLM's
// max_tracker_size).
const DefaultReuseTrackerSize = 64_000

// reuseTracker counts lookups per key for the reuse filter of docs/semantics.md §3.2
// (store_threshold): a block is stored only once it has been looked up
// threshold times. It is an LRU-bounded counter table: a lookup bumps the
// key's count and makes it most recent; a new key evicts the least recent
// when full. Entries hold the key's 64-bit hash, not the key.
type reuseTracker struct {
	threshold uint32
	capacity  int
	hashes    []uint64
	counts    []uint32
	links     []link
	order     list
	index     hashIndex
	free      int32 // chain through links.next, -1 empty
	fresh     int32 // entries never used start here
}

func newReuseTracker(threshold, capacity int) *reuseTracker {
	t := &reuseTracker{
		threshold: uint32(threshold),
		capacity:  capacity,
		hashes:    make([]uint64, capacity),
		counts:    make([]uint32, capacity),
		links:     make([]link, capacity),
		order:     emptyList,
		index:     newHashIndex(capacity, 1, 2),
		free:      -1,
	}
	return t
}

func (t *reuseTracker) find(h uint64) int32 {
	h32 := uint32(h)
	for i := t.index.home(h32); ; i = t.index.next(i) {
		e := t.index.b[i]
		if e.id < 0 {
			return -1
		}
		if e.h == h32 && t.hashes[e.id] == h {
			return e.id
		}
	}
}

// seen records one lookup of the key hashed to h.
func (t *reuseTracker) seen(h uint64) {
	if e := t.find(h); e >= 0 {
		if t.counts[e] < ^uint32(0) {
			t.counts[e]++
		}
		t.order.moveToBack(t.links, e)
		return
	}
	if t.order.n >= t.capacity {
		old := t.order.head
		t.order.unlink(t.links, old)
		t.index.remove(uint32(t.hashes[old]), old)
		t.links[old].next = t.free
		t.free = old
	}
	e := t.free
	if e >= 0 {
		t.free = t.links[e].next
	} else {
		e = t.fresh
		t.fresh++
	}
	t.hashes[e], t.counts[e] = h, 1
	t.order.pushBack(t.links, e)
	t.index.insert(uint32(h), e)
}

// reused reports whether the key hashed to h was looked up at least
// threshold times (while it stayed in the tracker).
func (t *reuseTracker) reused(h uint64) bool {
	e := t.find(h)
	return e >= 0 && t.counts[e] >= t.threshold
}
