package cpu

import "github.com/kvtier/kvtier/offload"

// lruPolicy is the evictable-list LRU of docs/semantics.md §3.4: only ready blocks with
// no reader are listed, in the order they became evictable or were last
// touched; pending and pinned blocks are not ordered at all. A block held
// by soft pins only (a cascade reading it) stays listed: its order is the
// one it would have unpinned.
type lruPolicy struct {
	b         *blocks
	evictable list

	// The walk of a pick (startPick, pickOne).
	cursor    int32
	pickEpoch uint32
	revoke    func(int32) bool
}

func newLRU(b *blocks) *lruPolicy { return &lruPolicy{b: b, evictable: emptyList} }

func (p *lruPolicy) name() string { return "lru" }

// inserted: a new block starts pending, so it is not listed.
func (p *lruPolicy) inserted(int32) {}

func (p *lruPolicy) removed(s int32) {
	if p.b.meta[s].list == inEvictable {
		p.evictable.unlink(p.b.links, s)
		p.b.meta[s].list = inNoList
	}
}

// becameEvictable appends at the MRU end: finishing a store or the last
// load counts as a use.
func (p *lruPolicy) becameEvictable(s int32) {
	p.evictable.pushBack(p.b.links, s)
	p.b.meta[s].list = inEvictable
}

func (p *lruPolicy) pinned(s int32) { p.removed(s) }

// touch moves the listed keys to the MRU end in reverse order, so that the
// first key ends most recent. Absent, pending and pinned keys are skipped.
func (p *lruPolicy) touch(keys []offload.Key) {
	b := p.b
	slots := b.resolve(keys)
	for i := len(slots) - 1; i >= 0; i-- {
		if s := slots[i]; s >= 0 && b.meta[s].list == inEvictable {
			p.evictable.moveToBack(b.links, s)
		}
	}
}

// evict picks the n oldest evictable blocks not marked with epoch and
// unlists them; it changes nothing when there are fewer than n.
func (p *lruPolicy) evict(n int, epoch uint32, out []int32, revoke func(int32) bool) ([]int32, bool) {
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

// startPick starts a walk of the evictable list from its oldest block.
func (p *lruPolicy) startPick(epoch uint32, revoke func(int32) bool) {
	p.cursor, p.pickEpoch, p.revoke = p.evictable.head, epoch, revoke
}

// pickOne returns the next victim of the walk, changing nothing; -1 when
// there is none.
func (p *lruPolicy) pickOne() int32 {
	b := p.b
	for s := p.cursor; s >= 0; s = b.links[s].next {
		if m := &b.meta[s]; m.mark != p.pickEpoch && (m.ref == 0 || p.revoke(s)) {
			p.cursor = b.links[s].next
			return s
		}
	}
	p.cursor = -1
	return -1
}

// commit unlists the victims picked.
func (p *lruPolicy) commit(victims []int32) {
	for _, s := range victims {
		p.evictable.unlink(p.b.links, s)
		p.b.meta[s].list = inNoList
	}
	p.revoke = nil
}

func (p *lruPolicy) forgetHistory() {}

func (p *lruPolicy) clear() { p.evictable = emptyList }
