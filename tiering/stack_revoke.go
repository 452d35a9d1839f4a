// Revocation: when eviction reaches a block that only cascades pin, the
// primary asks the stack to take it back — a queued cascade is withdrawn,
// a running one releases the block unless a tier is reading it — so that a
// secondary tier never makes the primary keep what it would have evicted.

package tiering

import (
	"slices"

	"github.com/kvtier/kvtier/offload"
)

// Revoke releases the cascades' pins on slot, if it can do so without
// tearing a transfer. For each cascade reading the slot, the jobs of
// tiers that claim blocks (offload.BlockClaimer) give that one block back
// unless a tier is reading it at this moment (they go on with their other
// blocks); the other jobs are withdrawn whole if still queued in their
// tier (offload.JobQueue), counted as dropped (DropCancelled). It reports
// false, leaving the cascade's pins in place, when a job that does not
// claim blocks has started or its tier cannot withdraw it, or a tier is
// reading the block; jobs withdrawn by then stay withdrawn. The primary
// calls it (through the driver) when eviction reaches a block held by
// cascades only, so that cascades never keep a block the primary alone
// would have evicted.
func (s *Stack) Revoke(slot int64) bool {
	if s.bySlot == nil || slot < 0 || slot >= int64(len(s.bySlot)) {
		return false
	}
	if gid := s.bySlot[slot]; gid != 0 && !s.withdraw(gid, slot) {
		return false
	}
	if s.readers[slot] == 0 {
		return true
	}
	// Several cascades read the slot (a request-level tier was offered
	// blocks again): the index names only the latest, so look for the
	// others among the jobs in flight. This is rare and off the hot path.
	var others []int32
	for _, jb := range s.jobs {
		if jb.gid != 0 && !slices.Contains(others, jb.gid) && slices.Contains(jb.j.Slots, slot) {
			others = append(others, jb.gid)
		}
	}
	for _, gid := range others {
		if !s.withdraw(gid, slot) {
			return false
		}
	}
	return true
}

// withdraw releases cascade gid's pins on slot (see Revoke) and reports
// whether none is left.
func (s *Stack) withdraw(gid int32, slot int64) bool {
	// The entry may be freed as its last job ends: copy what is needed.
	g := s.groups[gid-1]
	var claims offload.Claims
	for id := g.first; id < g.first+uint64(g.n); id++ {
		jb, live := s.jobs[id]
		switch {
		case !live:
		case jb.tier.claims:
			claims = jb.j.Claims
		case jb.tier.queue == nil:
			return false
		}
	}
	all := true
	for id := g.first; id < g.first+uint64(g.n); id++ {
		jb, live := s.jobs[id]
		if !live || jb.tier.claims {
			continue // answered, failed at submission, or given back per block
		}
		if !s.tierCancel(jb.tier, jb.j.ID) {
			all = false
			continue
		}
		delete(s.jobs, jb.j.ID)
		s.countDrop(jb.tier, DropCancelled, len(jb.j.Keys))
		s.endCascade(jb)
	}
	if !all || claims == nil {
		return all
	}
	return s.takeBack(gid, claims, slot)
}

// takeBack takes the block in slot back from the jobs of cascade gid,
// all of them of tiers that claim blocks, unless a tier is reading it:
// each job's pin is released, the block no longer counts against the
// budget nor names the cascade in the index.
func (s *Stack) takeBack(gid int32, claims offload.Claims, slot int64) bool {
	g := &s.groups[gid-1]
	var i int
	s.release = s.release[:0]
	for id := g.first; id < g.first+uint64(g.n); id++ {
		jb, live := s.jobs[id]
		if !live {
			continue
		}
		if len(s.release) == 0 {
			if i = slices.Index(jb.j.Slots, slot); i < 0 || claims.Revoked(i) {
				return true // taken back before (the slot holds another block now)
			}
			if !claims.Revoke(i) {
				return false // a tier is reading it
			}
		}
		s.release = append(s.release, slot)
		jb.released++
		jb.tier.pinned--
		jb.tier.stats.CascadeBlocksRevoked++
	}
	if len(s.release) == 0 {
		return true
	}
	s.releaser.ReleaseBlock(s.release)
	g.slots--
	s.pinned--
	s.readers[slot]--
	if s.bySlot[slot] == gid {
		s.bySlot[slot] = 0
	}
	return true
}
