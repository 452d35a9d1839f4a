package cpu

import (
	"fmt"
	"math"

	"github.com/kvtier/kvtier/keyspace"
	"github.com/kvtier/kvtier/offload"
)

// Shares: the primary divided between the owners of its blocks (tenants).
//
// A block's owner is read from its key (keyspace.IDOf): the configured
// share whose space tagged it, else owner 0, the pool of untagged keys and
// of spaces no share names. Each owner has a quota (slots it is
// guaranteed), a weight, and its own eviction order (an LRU or ARC of its
// blocks only). A store by owner t that must evict takes, one victim at a
// time, the oldest block of the owner furthest above its quota —
// (held − quota) / weight, largest first — and only when no owner is
// above its quota one of t's own blocks. So an owner at or below its
// quota never loses a block to another owner's store, an owner above it
// is evicted down to exactly its quota, and an idle share is lent to
// whoever stores, not reserved empty.

// MaxShares bounds the shares of a primary (owner 0 not counted).
const MaxShares = 255

// Share is one owner's part of the primary.
type Share struct {
	// Space is the keyspace ID of the owner's keys (non-zero).
	Space uint64
	// Slots is the owner's quota: slots it holds that no other owner's
	// store evicts.
	Slots int
	// Weight scales how far above its quota the owner may stay before
	// another's store evicts it, relative to the others (> 0; 0 means 1).
	Weight float64
}

// ShareStats is the occupancy of one owner; index 0 of Primary.Shares is
// the untagged pool.
type ShareStats struct {
	Space uint64
	Quota int
	// Held counts the owner's slots: ready, pinned and pending blocks.
	Held int
	// Evicted counts the owner's blocks evicted, by its own stores and by
	// others'.
	Evicted uint64
	// EvictedByOthers counts those evicted by another owner's store (or a
	// lease).
	EvictedByOthers uint64
}

// shares is the owner table and the policy that evicts across owners.
type shares struct {
	b      *blocks
	owner  map[uint64]uint8 // space → owner
	pols   []policy         // per owner
	quota  []int
	weight []float64
	held   []int
	stats  []ShareStats

	// storer is the owner of the store being prepared.
	storer uint8
	// The last space ownerOf looked up, and its owner.
	lastID    uint64
	lastOwner uint8
	// Per evict call: each owner's held count less the victims picked,
	// whether its order has no candidate left, and its victims.
	virt      []int
	exhausted []bool
	picked    [][]int32
}

// newShares validates cfg's shares for n slots; owner 0's quota is what
// the shares leave.
func newShares(b *blocks, n int, list []Share, arc bool) (*shares, error) {
	if len(list) > MaxShares {
		return nil, fmt.Errorf("cpu: %d shares, at most %d", len(list), MaxShares)
	}
	sh := &shares{b: b, owner: make(map[uint64]uint8, len(list))}
	total := 0
	sh.quota = append(sh.quota, 0)
	sh.weight = append(sh.weight, 1)
	for i, s := range list {
		switch {
		case s.Space == 0:
			return nil, fmt.Errorf("cpu: share %d: space 0 is the untagged pool", i)
		case s.Slots < 0:
			return nil, fmt.Errorf("cpu: share %d: quota of %d slots", i, s.Slots)
		case s.Weight < 0 || math.IsNaN(s.Weight) || math.IsInf(s.Weight, 0):
			return nil, fmt.Errorf("cpu: share %d: weight %v, want > 0", i, s.Weight)
		}
		if _, dup := sh.owner[s.Space]; dup {
			return nil, fmt.Errorf("cpu: share %d: space %#x listed twice", i, s.Space)
		}
		total += s.Slots
		if total > n {
			return nil, fmt.Errorf("cpu: the shares' quotas add up to more than the primary's %d slots", n)
		}
		sh.owner[s.Space] = uint8(i + 1)
		sh.quota = append(sh.quota, s.Slots)
		sh.weight = append(sh.weight, cmpOr(s.Weight, 1))
	}
	sh.quota[0] = n - total
	owners := len(sh.quota)
	sh.held = make([]int, owners)
	sh.stats = make([]ShareStats, owners)
	sh.virt = make([]int, owners)
	sh.exhausted = make([]bool, owners)
	sh.picked = make([][]int32, owners)
	for o := range owners {
		if arc {
			// An owner's ghosts remember as many blocks as its quota (at
			// least one): the shares' ghosts together cost what one ARC's
			// do.
			sh.pols = append(sh.pols, newARC(b, max(sh.quota[o], 1)))
		} else {
			sh.pols = append(sh.pols, newLRU(b))
		}
		sh.stats[o].Quota = sh.quota[o]
		if o > 0 {
			sh.stats[o].Space = list[o-1].Space
		}
	}
	return sh, nil
}

func cmpOr(w, def float64) float64 {
	if w == 0 {
		return def
	}
	return w
}

// ownerOf returns the owner of key k. The keys of one call are nearly
// always one tenant's: the last space looked up is remembered.
func (sh *shares) ownerOf(k offload.Key) uint8 {
	id, ok := keyspace.IDOf(k)
	if !ok {
		return 0
	}
	if id != sh.lastID {
		sh.lastID, sh.lastOwner = id, sh.owner[id] // 0 when no share names the space
	}
	return sh.lastOwner
}

// take and drop count slot s for and against its owner.
func (sh *shares) take(s int32, o uint8) {
	sh.b.meta[s].owner = o
	sh.held[o]++
}

func (sh *shares) drop(s int32) { sh.held[sh.b.meta[s].owner]-- }

// The policy interface, each call sent to the owner's order.

func (sh *shares) name() string            { return sh.pols[0].name() }
func (sh *shares) inserted(s int32)        { sh.pols[sh.b.meta[s].owner].inserted(s) }
func (sh *shares) removed(s int32)         { sh.pols[sh.b.meta[s].owner].removed(s) }
func (sh *shares) becameEvictable(s int32) { sh.pols[sh.b.meta[s].owner].becameEvictable(s) }
func (sh *shares) pinned(s int32)          { sh.pols[sh.b.meta[s].owner].pinned(s) }

// touch sends each run of keys of one owner to that owner's order: a call
// is normally all one tenant's.
func (sh *shares) touch(keys []offload.Key) {
	for len(keys) > 0 {
		o := sh.ownerOf(keys[0])
		n := 1
		for n < len(keys) && sh.ownerOf(keys[n]) == o {
			n++
		}
		sh.pols[o].touch(keys[:n])
		keys = keys[n:]
	}
}

func (sh *shares) forgetHistory() {
	for _, p := range sh.pols {
		p.forgetHistory()
	}
}

func (sh *shares) clear() {
	for _, p := range sh.pols {
		p.clear()
	}
}

// Shares evict across owners only through evict.
func (sh *shares) startPick(uint32, func(int32) bool) { panic("cpu: shares pick through evict") }
func (sh *shares) pickOne() int32                     { panic("cpu: shares pick through evict") }
func (sh *shares) commit([]int32)                     { panic("cpu: shares pick through evict") }

// evict picks n victims for a store by sh.storer (see the top of this
// file), all or nothing.
func (sh *shares) evict(n int, epoch uint32, out []int32, revoke func(int32) bool) ([]int32, bool) {
	for o, p := range sh.pols {
		p.startPick(epoch, revoke)
		sh.virt[o] = sh.held[o]
		sh.exhausted[o] = false
		sh.picked[o] = sh.picked[o][:0]
	}
	for got := 0; got < n; {
		o := sh.victimOwner()
		if o < 0 {
			return out, false
		}
		s := sh.pols[o].pickOne()
		if s < 0 {
			sh.exhausted[o] = true
			continue
		}
		sh.picked[o] = append(sh.picked[o], s)
		sh.virt[o]--
		got++
	}
	for o, victims := range sh.picked {
		if len(victims) == 0 {
			continue
		}
		sh.pols[o].commit(victims)
		out = append(out, victims...)
		sh.stats[o].Evicted += uint64(len(victims))
		if o != int(sh.storer) {
			sh.stats[o].EvictedByOthers += uint64(len(victims))
		}
	}
	return out, true
}

// victimOwner returns the owner to take the next victim from: the one
// furthest above its quota, weighted, that has candidates left; else the
// storer; -1 when neither has a candidate.
func (sh *shares) victimOwner() int {
	best, bestOver := -1, 0.0
	for o, v := range sh.virt {
		if v <= sh.quota[o] || sh.exhausted[o] {
			continue
		}
		over := float64(v-sh.quota[o]) / sh.weight[o]
		if best < 0 || over > bestOver {
			best, bestOver = o, over
		}
	}
	if best < 0 && !sh.exhausted[sh.storer] {
		best = int(sh.storer)
	}
	return best
}

// Shares returns each owner's occupancy: index 0 is the untagged pool,
// then the shares in the order configured. Nil without shares.
func (p *Primary) Shares() []ShareStats {
	if p.sh == nil {
		return nil
	}
	out := make([]ShareStats, len(p.sh.stats))
	copy(out, p.sh.stats)
	for o := range out {
		out[o].Held = p.sh.held[o]
	}
	return out
}

// OwnerOf returns the owner of key k: its share's index plus one, or 0
// for the untagged pool (always 0 without shares).
func (p *Primary) OwnerOf(k offload.Key) int {
	if p.sh == nil {
		return 0
	}
	return int(p.sh.ownerOf(k))
}

// Quotas returns each owner's quota in slots (index 0 the untagged pool,
// then the shares in order); nil without shares.
func (p *Primary) Quotas() []int {
	if p.sh == nil {
		return nil
	}
	return append([]int(nil), p.sh.quota...)
}
