package cpu

import (
	"fmt"

	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/quota"
)

// Shares: the primary divided between the owners of its blocks
// (tenants) by package quota's rule. A block's owner is read from its key
// (quota.Table.OwnerOf); each owner has its own eviction order, an LRU or
// ARC of its blocks only, and a store that must evict asks the table, one
// victim at a time, whose order to take the oldest block from.

// MaxShares bounds the shares of a primary (owner 0 not counted).
const MaxShares = quota.MaxShares

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

// shares is the owner table (package quota) and the policy that evicts
// across owners.
type shares struct {
	b     *blocks
	t     *quota.Table
	pols  []policy // per owner
	held  []int64
	stats []ShareStats

	// storer is the owner of the store being prepared.
	storer uint8
	// Per evict call: each owner's held count less the victims picked,
	// whether its order has no candidate left, and its victims.
	virt      []int64
	exhausted []bool
	picked    [][]int32
}

// newShares validates cfg's shares for n slots; owner 0's quota is what
// the shares leave.
func newShares(b *blocks, n int, list []Share, arc bool) (*shares, error) {
	qs := make([]quota.Share, len(list))
	for i, s := range list {
		qs[i] = quota.Share{Space: s.Space, Quota: int64(s.Slots), Weight: s.Weight}
	}
	t, err := quota.New(qs, int64(n), func(v int64) string { return fmt.Sprintf("%d slots", v) })
	if err != nil {
		return nil, fmt.Errorf("cpu: %w", err)
	}
	owners := t.Owners()
	sh := &shares{
		b: b, t: t,
		held: make([]int64, owners), stats: make([]ShareStats, owners),
		virt: make([]int64, owners), exhausted: make([]bool, owners), picked: make([][]int32, owners),
	}
	for o := range owners {
		q := int(t.Quota(o))
		if arc {
			// An owner's ghosts remember as many blocks as its quota (at
			// least one): the shares' ghosts together cost what one ARC's
			// do.
			sh.pols = append(sh.pols, newARC(b, max(q, 1)))
		} else {
			sh.pols = append(sh.pols, newLRU(b))
		}
		sh.stats[o].Quota, sh.stats[o].Space = q, t.Space(o)
	}
	return sh, nil
}

// ownerOf returns the owner of key k.
func (sh *shares) ownerOf(k offload.Key) uint8 { return sh.t.OwnerOf(k) }

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
		o := sh.t.Victim(sh.virt, sh.exhausted, int(sh.storer))
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

// Shares returns each owner's occupancy: index 0 is the untagged pool,
// then the shares in the order configured. Nil without shares.
func (p *Primary) Shares() []ShareStats {
	if p.sh == nil {
		return nil
	}
	out := make([]ShareStats, len(p.sh.stats))
	copy(out, p.sh.stats)
	for o := range out {
		out[o].Held = int(p.sh.held[o])
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

// OwnerOfSpace returns the owner of the keys of space id, as OwnerOf
// returns a key's; safe for concurrent use (the owners are fixed at New).
func (p *Primary) OwnerOfSpace(id uint64) int {
	if p.sh == nil {
		return 0
	}
	return int(p.sh.t.OwnerOfSpace(id))
}

// Quotas returns each owner's quota in slots (index 0 the untagged pool,
// then the shares in order); nil without shares.
func (p *Primary) Quotas() []int {
	if p.sh == nil {
		return nil
	}
	out := make([]int, p.sh.t.Owners())
	for o := range out {
		out[o] = int(p.sh.t.Quota(o))
	}
	return out
}
