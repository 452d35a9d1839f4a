package cpu

import (
	"math"

	"github.com/kvtier/kvtier/offload"
)

// arcPolicy is the ARC policy of docs/semantics.md §3.4. T1 (seen once) and T2 (seen
// again) list every block, pending and pinned ones included; eviction
// skips those. B1 and B2 are ghost lists of keys recently evicted from T1
// and T2, each of at most capacity ghosts; a touch of a ghost key moves
// the target size of T1 towards the list that would have kept it.
//
// Ghosts hold only an identity taken from the key's hash, not the key
// (see ghostTable), so that a ghost costs 12 bytes plus its share of free
// table entries — 32 bytes per slot for both lists — and does not retain
// the caller's key memory.
type arcPolicy struct {
	b        *blocks
	t1, t2   list
	capacity int
	target   float64 // target size of T1, in [0, capacity]
	ghosts   ghostTable
	pick     arcPick
}

// arcPick is the state of a selection of victims (startPick, pickOne):
// the next candidates of T1 and T2 and T1's size less what was taken.
type arcPick struct {
	c1, c2    int32
	virtualT1 int
	epoch     uint32
	revoke    func(int32) bool
}

func newARC(b *blocks, capacity int) *arcPolicy {
	p := &arcPolicy{b: b, capacity: capacity, ghosts: newGhostTable(2 * capacity)}
	p.clear()
	return p
}

func (p *arcPolicy) name() string { return "arc" }

func (p *arcPolicy) clear() {
	p.t1, p.t2 = emptyList, emptyList
	p.target = 0
	p.ghosts.clear()
}

// inserted adds a new (pending) block at the MRU end of T1 and forgets
// any ghost of its key.
func (p *arcPolicy) inserted(s int32) {
	p.t1.pushBack(p.b.links, s)
	p.b.meta[s].list = inT1
	if g := p.ghosts.find(ghostID(p.b.meta[s].h32)); g != noGhost {
		p.ghosts.remove(g)
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
	slots := b.resolve(keys) // touching changes no slot
	for i := len(keys) - 1; i >= 0; i-- {
		if s := slots[i]; s >= 0 {
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
		g := p.ghosts.find(ghostID(uint32(b.hashes[i])))
		if g == noGhost {
			continue
		}
		b1, b2 := float64(p.ghosts.lists[0].n), float64(p.ghosts.lists[1].n)
		if p.ghosts.list(g) == 0 { // B1: recency would have kept it
			p.target = math.Min(p.target+math.Max(1, b2/b1), float64(p.capacity))
		} else { // B2: frequency would have kept it
			p.target = math.Max(p.target-math.Max(1, b1/b2), 0)
		}
		p.ghosts.moveToBack(g)
	}
}

// candidate returns the first slot from s onwards (following links) that
// may be evicted: ready, unpinned (or held by soft pins that revoke
// releases) and not protected by epoch; -1 if none.
func (p *arcPolicy) candidate(s int32, epoch uint32, revoke func(int32) bool) int32 {
	b := p.b
	for s >= 0 {
		m := &b.meta[s]
		if m.mark != epoch && (m.ref == 0 || m.ref > 0 && m.ref == int32(m.soft) && revoke(s)) {
			return s
		}
		s = b.links[s].next
	}
	return s
}

// evict selects n victims without changing anything, then commits them
// (pickOne says in which order).
func (p *arcPolicy) evict(n int, epoch uint32, out []int32, revoke func(int32) bool) ([]int32, bool) {
	start := len(out)
	p.startPick(epoch, revoke)
	for len(out)-start < n {
		s := p.pickOne()
		if s < 0 {
			return out[:start], false
		}
		out = append(out, s)
	}
	p.commit(out[start:])
	return out, true
}

// startPick starts a selection of victims from the oldest ends of T1 and
// T2.
func (p *arcPolicy) startPick(epoch uint32, revoke func(int32) bool) {
	p.pick = arcPick{c1: p.t1.head, c2: p.t2.head, virtualT1: p.t1.n, epoch: epoch, revoke: revoke}
}

// pickOne returns the next victim without changing anything, -1 if none:
// the oldest T1 candidate while T1 (less what was already taken from it)
// is at least the target, else the oldest T2 candidate; if T2 has none,
// T1 is used regardless of the target.
func (p *arcPolicy) pickOne() int32 {
	k := &p.pick
	links := p.b.links
	if k.virtualT1 >= int(p.target) {
		if k.c1 = p.candidate(k.c1, k.epoch, k.revoke); k.c1 >= 0 {
			s := k.c1
			k.c1 = links[s].next
			k.virtualT1--
			return s
		}
	}
	if k.c2 = p.candidate(k.c2, k.epoch, k.revoke); k.c2 >= 0 {
		s := k.c2
		k.c2 = links[s].next
		return s
	}
	if k.c1 = p.candidate(k.c1, k.epoch, k.revoke); k.c1 >= 0 {
		s := k.c1
		k.c1 = links[s].next
		k.virtualT1--
		return s
	}
	return -1
}

// commit unlists the victims picked and remembers them as ghosts.
func (p *arcPolicy) commit(victims []int32) {
	links := p.b.links
	for _, s := range victims {
		m := &p.b.meta[s]
		pool := 0
		if m.list == inT1 {
			p.t1.unlink(links, s)
		} else {
			p.t2.unlink(links, s)
			pool = 1
		}
		m.list = inNoList
		p.addGhost(pool, ghostID(m.h32))
	}
	p.pick.revoke = nil
}

// forgetHistory drops the ghosts and the adapted target.
func (p *arcPolicy) forgetHistory() {
	p.ghosts.clear()
	p.target = 0
}

// addGhost appends a ghost at the newest end of B1 (list 0) or B2 (list
// 1), first dropping the list's oldest ghost when it is full: the same
// final lists as appending everything and trimming to capacity afterwards.
func (p *arcPolicy) addGhost(l int, id uint32) {
	g := &p.ghosts
	if old := g.find(id); old != noGhost {
		g.remove(old) // only possible when two keys share an identity
	}
	if g.lists[l].n >= p.capacity {
		g.remove(g.lists[l].head)
	}
	g.add(l, id)
}
