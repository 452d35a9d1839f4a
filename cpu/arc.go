package cpu

import (
	"math"

	"github.com/kvtier/kvtier/offload"
)

// arcPolicy is the ARC policy of spec §3.4. T1 (seen once) and T2 (seen
// again) list every block, pending and pinned ones included; eviction
// skips those. B1 and B2 are ghost lists of keys recently evicted from T1
// and T2; a touch of a ghost key moves the target size of T1 towards the
// list that would have kept it.
//
// Ghost entries hold only the key's 64-bit hash, not the key, so that a
// ghost costs 16 bytes plus its index bucket and does not retain the
// caller's key memory. A hash collision can at worst nudge the target.
type arcPolicy struct {
	b        *blocks
	t1, t2   list
	capacity int
	target   float64 // target size of T1, in [0, capacity]

	// Ghosts live in two fixed pools of capacity entries each: ids
	// [0, capacity) belong to B1 and [capacity, 2·capacity) to B2. A ghost
	// never moves between B1 and B2, so the pool tells the list.
	ghostHash []uint64
	glinks    []link
	gindex    hashIndex
	ghosts    [2]list  // B1, B2
	gfree     [2]int32 // free chain (through glinks.next) per pool, -1 empty
	gfresh    [2]int32 // ids of a pool never used yet start here
}

func newARC(b *blocks, capacity int) *arcPolicy {
	p := &arcPolicy{
		b:         b,
		capacity:  capacity,
		ghostHash: make([]uint64, 2*capacity),
		glinks:    make([]link, 2*capacity),
		// Ghost lookups are rarer than block lookups: allow load 3/4.
		gindex: newHashIndex(2*capacity, 3, 4),
	}
	p.clear()
	return p
}

func (p *arcPolicy) name() string { return "arc" }

func (p *arcPolicy) clear() {
	p.t1, p.t2 = emptyList, emptyList
	p.target = 0
	p.ghosts = [2]list{emptyList, emptyList}
	p.gfree = [2]int32{-1, -1}
	p.gfresh = [2]int32{0, int32(p.capacity)}
	p.gindex.clear()
}

// inserted adds a new (pending) block at the MRU end of T1 and forgets
// any ghost of its key.
func (p *arcPolicy) inserted(s int32, h uint64) {
	p.t1.pushBack(p.b.links, s)
	p.b.meta[s].list = inT1
	if g := p.findGhost(h); g >= 0 {
		p.dropGhost(g)
	}
}

// removed drops a block whose store failed, leaving no ghost.
func (p *arcPolicy) removed(s int32) {
	switch p.b.meta[s].list {
	case inT1:
		p.t1.unlink(p.b.links, s)
	case inT2:
		p.t2.unlink(p.b.links, s)
	}
	p.b.meta[s].list = inNoList
}

// ARC decides evictability from ref counts at eviction time.
func (p *arcPolicy) becameEvictable(int32) {}
func (p *arcPolicy) pinned(int32)          {}

func (p *arcPolicy) touch(keys []offload.Key) {
	b := p.b
	for i := len(keys) - 1; i >= 0; i-- {
		h := b.hash(keys[i])
		if s := b.find(keys[i], h); s >= 0 {
			switch b.meta[s].list {
			case inT1:
				if b.meta[s].ref < 0 {
					// Just prepared for storing, not really seen twice.
					p.t1.moveToBack(b.links, s)
				} else {
					p.t1.unlink(b.links, s)
					p.t2.pushBack(b.links, s)
					b.meta[s].list = inT2
				}
			case inT2:
				p.t2.moveToBack(b.links, s)
			}
			continue
		}
		g := p.findGhost(h)
		if g < 0 {
			continue
		}
		b1, b2 := float64(p.ghosts[0].n), float64(p.ghosts[1].n)
		if g < int32(p.capacity) { // B1: recency would have kept it
			p.target = math.Min(p.target+math.Max(1, b2/b1), float64(p.capacity))
			p.ghosts[0].moveToBack(p.glinks, g)
		} else { // B2: frequency would have kept it
			p.target = math.Max(p.target-math.Max(1, b1/b2), 0)
			p.ghosts[1].moveToBack(p.glinks, g)
		}
	}
}

// candidate returns the first slot from s onwards (following links) that
// may be evicted: ready, unpinned and not protected by epoch; -1 if none.
func (p *arcPolicy) candidate(s int32, epoch uint32) int32 {
	b := p.b
	for s >= 0 && (b.meta[s].ref != 0 || b.meta[s].mark == epoch) {
		s = b.links[s].next
	}
	return s
}

// evict selects n victims without changing anything, then commits them:
// take the oldest T1 candidate while T1 (less what was already taken from
// it) is at least the target, else the oldest T2 candidate; if T2 has
// none, T1 is used regardless of the target, and only when neither list
// has a candidate does the call fail.
func (p *arcPolicy) evict(n int, epoch uint32, out []int32) ([]int32, bool) {
	start := len(out)
	links := p.b.links
	c1, c2 := p.t1.head, p.t2.head
	virtualT1 := p.t1.n
	for len(out)-start < n {
		if virtualT1 >= int(p.target) {
			if c1 = p.candidate(c1, epoch); c1 >= 0 {
				out = append(out, c1)
				c1 = links[c1].next
				virtualT1--
				continue
			}
		}
		if c2 = p.candidate(c2, epoch); c2 >= 0 {
			out = append(out, c2)
			c2 = links[c2].next
			continue
		}
		if c1 = p.candidate(c1, epoch); c1 >= 0 {
			out = append(out, c1)
			c1 = links[c1].next
			virtualT1--
			continue
		}
		return out[:start], false
	}
	for _, s := range out[start:] {
		m := &p.b.meta[s]
		pool := 0
		if m.list == inT1 {
			p.t1.unlink(links, s)
		} else {
			p.t2.unlink(links, s)
			pool = 1
		}
		m.list = inNoList
		p.addGhost(pool, p.b.hash(m.key))
	}
	return out, true
}

func (p *arcPolicy) findGhost(h uint64) int32 {
	t := &p.gindex
	h32 := uint32(h)
	for i := h32 & t.mask; ; i = (i + 1) & t.mask {
		e := t.b[i]
		if e.id < 0 {
			return -1
		}
		if e.h == h32 && p.ghostHash[e.id] == h {
			return e.id
		}
	}
}

// addGhost appends a ghost at the MRU end of B1 (pool 0) or B2 (pool 1),
// first dropping the pool's LRU ghost when it is full: the same final
// lists as appending everything and trimming to capacity afterwards.
func (p *arcPolicy) addGhost(pool int, h uint64) {
	if old := p.findGhost(h); old >= 0 {
		p.dropGhost(old) // only possible on a hash collision
	}
	if p.ghosts[pool].n >= p.capacity {
		p.dropGhost(p.ghosts[pool].head)
	}
	g := p.gfree[pool]
	if g >= 0 {
		p.gfree[pool] = p.glinks[g].next
	} else {
		g = p.gfresh[pool]
		p.gfresh[pool]++
	}
	p.ghostHash[g] = h
	p.ghosts[pool].pushBack(p.glinks, g)
	p.gindex.insert(h, g)
}

func (p *arcPolicy) dropGhost(g int32) {
	pool := 0
	if g >= int32(p.capacity) {
		pool = 1
	}
	p.ghosts[pool].unlink(p.glinks, g)
	p.gindex.remove(p.ghostHash[g], g)
	p.glinks[g].next = p.gfree[pool]
	p.gfree[pool] = g
}
