// Cascades and their budget: a stored block is offered to every tier the
// request's store filter allows; the jobs of one cascade share a group,
// pins count against the primary's cascade budget and each tier's share,
// and admission (back-pressure, queue room) may drop a job, counted.

package tiering

import (
	"time"

	"github.com/kvtier/kvtier/offload"
)

// cascadeGroup is the state the jobs of one cascade share. It holds no
// pointer: the cascade's jobs have the consecutive ids first, first+1,
// …, first+n-1 (Cascade issues no other id while it submits them).
type cascadeGroup struct {
	first uint64
	n     int32 // jobs submitted
	jobs  int32 // jobs without an outcome yet
	slots int32 // slots counted against the budget
	owner int32 // the owner whose share of the budget they count against
	open  bool  // Cascade is still submitting its jobs
}

// Cascade submits a store of keys (owned by the jobs from now on) to
// every tier in mask that req's store filter allows and admission
// accepts, pinning the source blocks once per job through the driver.
// Only the first job resolves the keys (PinCascade); the others pin the
// same slots (PinAgain). The jobs share keys and slots, which tiers only
// read. It returns the number of jobs submitted; each one's outcome
// reaches Driver.CascadeDone.
func (s *Stack) Cascade(keys []offload.Key, req *offload.ReqContext, mask uint64) int {
	_, n := s.CascadeFrom(s.arena, keys, req, mask)
	return n
}

// CascadeFrom is Cascade out of the slots of arena a instead of the
// stack's arena. It also returns the id of the cascade's first job: its n
// jobs have the ids first, first+1, …, first+n-1, so that a driver can
// tell which cascade a CascadeDone belongs to even when it arrives during
// the call (a submission that panicked).
func (s *Stack) CascadeFrom(a offload.Arena, keys []offload.Key, req *offload.ReqContext, mask uint64) (first uint64, n int) {
	first, n, keys, mask = s.cascade(a, keys, req, mask, false)
	if mask != 0 {
		s.dq.push(deferred{keys: keys, req: req, mask: mask})
	}
	return first, n
}

// cascade submits the jobs of a cascade (retry: a deferred one, which
// owes the tiers in mask). A tier the budget cannot take now is left to
// the caller to defer when canDefer allows: it returns the keys (those
// still in the primary) and the tiers they are owed to.
func (s *Stack) cascade(a offload.Arena, keys []offload.Key, req *offload.ReqContext, mask uint64, retry bool) (first uint64, n int, _ []offload.Key, owed uint64) {
	first = s.nextID
	filter := req.StoreFilter
	var now time.Time
	var slots []int64
	var block []job // the cascade's jobs, one allocation
	var gid int32
	var claims offload.Claims
	owner := -1
	if s.ownerOf != nil && len(keys) > 0 {
		owner = s.ownerOf(keys[0]) // one store's keys are one tenant's
	}
	// A retry is deferred again as a whole if it was before; a new
	// cascade only while the queue has room for it.
	mayDefer := retry || s.canDefer(a, len(keys))
	for _, ts := range s.tiers {
		if mask&(1<<ts.idx) == 0 || ts.readOnly {
			continue
		}
		if !filter.Allows(ts.medium, ts.locality) {
			ts.stats.CascadesSkippedByFilter++
			continue
		}
		if s.maxPinned > 0 || ts.queue != nil || ts.pressure.active {
			if r, drop := s.admit(ts, len(keys), owner, gid == 0 || s.groups[gid-1].jobs == 0); drop {
				if mayDefer && r.deferrable() {
					if !retry {
						ts.stats.CascadesDeferred++
					}
					owed |= 1 << ts.idx
					continue
				}
				s.countDrop(ts, r, len(keys))
				continue
			}
		}
		if slots != nil {
			// The blocks are pinned by the first job, so the slots still
			// name them.
			if err := s.drv.PinAgain(slots); err != nil {
				s.log.Error("tiering: cannot pin cascade source blocks", "tier", ts.name, "req", req.ID, "err", err)
				ts.stats.CascadesFailed++
				continue
			}
		} else {
			var err error
			var pinned []offload.Key
			pinned, slots, err = s.drv.PinCascade(keys)
			if err != nil {
				s.log.Error("tiering: cannot pin cascade source blocks", "tier", ts.name, "req", req.ID, "err", err)
				ts.stats.CascadesFailed++
				slots = nil
				continue
			}
			if retry && len(pinned) < len(keys) {
				// Left the primary while deferred: lost to every tier
				// still owed them (the ones visited so far are in owed).
				s.countDeferredLost(mask&^(1<<ts.idx-1)|owed, len(keys)-len(pinned))
			}
			if len(pinned) == 0 {
				return first, n, nil, 0
			}
			keys = pinned
		}
		if now.IsZero() {
			now = time.Now()
			block = make([]job, 0, len(s.tiers)-ts.idx)
		}
		block = block[:len(block)+1] // within capacity: one job per tier left
		jb := s.initJob(&block[len(block)-1], ts, keys, slots, false, req, now)
		jb.j.Arena = a
		if gid == 0 {
			gid = s.newGroup(int32(len(keys)), jb.j.ID)
			s.groups[gid-1].owner = int32(owner)
			if s.releaser != nil {
				claims = offload.NewClaims(len(keys))
			}
		}
		// Every job of the cascade carries its claims, so that the last
		// one to end knows which blocks Revoke took back.
		jb.j.Claims = claims
		s.joinGroup(jb, gid, slots)
		ts.pinned += len(keys)
		ts.cascadesInFlight++
		n++
		if !s.tierSubmit(ts, &jb.j) {
			s.failSubmitted(jb, "submit store panicked")
		}
	}
	if gid != 0 {
		g := &s.groups[gid-1]
		if g.open = false; g.jobs == 0 {
			s.freeGroup(gid)
		}
	}
	return first, n, keys, owed
}

// joinGroup makes jb a job of cascade gid, whose source blocks are in
// slots. While the cascade has a job (one whose submission panicked has
// already ended) it counts against the budget and is indexed for Revoke.
func (s *Stack) joinGroup(jb *job, gid int32, slots []int64) {
	g := &s.groups[gid-1]
	g.n++
	if g.jobs == 0 {
		s.pinned += int(g.slots)
		if g.owner >= 0 {
			s.ownerPinned[g.owner] += int(g.slots)
		}
		if s.bySlot != nil {
			for _, sl := range slots {
				s.bySlot[sl] = gid
				s.readers[sl]++
			}
		}
	}
	jb.gid = gid
	g.jobs++
}

// freeGroup returns a cascade's entry to the free list.
func (s *Stack) freeGroup(gid int32) {
	s.groups[gid-1] = cascadeGroup{}
	s.free = append(s.free, gid-1)
}

// newGroup takes a free cascade entry and returns its gid; it stays open
// (not freed when its jobs end) until Cascade has submitted them all.
func (s *Stack) newGroup(slots int32, first uint64) int32 {
	var i int32
	if n := len(s.free); n > 0 {
		i = s.free[n-1]
		s.free = s.free[:n-1]
	} else {
		s.groups = append(s.groups, cascadeGroup{})
		i = int32(len(s.groups) - 1)
	}
	s.groups[i] = cascadeGroup{slots: slots, first: first, open: true, owner: -1}
	return i + 1
}

// admit decides whether ts takes a cascade of n blocks of owner (-1:
// none); first is true while the cascade has no job yet (its blocks are
// not yet counted against the budget).
func (s *Stack) admit(ts *tier, n, owner int, first bool) (DropReason, bool) {
	if !s.adm.Disabled && ts.pressure.active && ts.cascadesInFlight > 0 {
		return DropPressure, true
	}
	if s.maxPinned > 0 {
		// With nothing in flight one cascade is admitted whatever its
		// size, so that a batch larger than the budget still cascades.
		if first && s.pinned > 0 && s.pinned+n > s.maxPinned {
			return DropBudget, true
		}
		if first && owner >= 0 {
			if p := s.ownerPinned[owner]; p > 0 && p+n > s.ownerMax[owner] {
				return DropTenantBudget, true
			}
		}
		if ts.pinned > 0 && ts.pinned+n > s.tierMaxPinned {
			return DropTierBudget, true
		}
	}
	if ts.queue != nil {
		if q, c := s.tierQueued(ts); c > 0 && q >= c {
			return DropQueueFull, true
		}
	}
	return 0, false
}

func (s *Stack) countDrop(ts *tier, r DropReason, blocks int) {
	ts.stats.CascadesDropped++
	ts.stats.CascadeBlocksDropped += uint64(blocks)
	ts.stats.DroppedBy[r]++
}

// endCascade releases what a cascade job held: its pins (through the
// driver), its share of the budget and its in-flight count.
func (s *Stack) endCascade(jb *job) {
	ts := jb.tier
	ts.cascadesInFlight--
	ts.pinned -= len(jb.j.Keys) - int(jb.released)
	claims := jb.j.Claims
	g := &s.groups[jb.gid-1]
	if g.jobs--; g.jobs == 0 {
		s.pinned -= int(g.slots)
		if g.owner >= 0 {
			s.ownerPinned[g.owner] -= int(g.slots)
		}
		if s.bySlot != nil {
			for i, sl := range jb.j.Slots {
				if claims != nil && claims.Revoked(i) {
					continue // unindexed when Revoke took it back
				}
				s.readers[sl]--
				if s.bySlot[sl] == jb.gid {
					s.bySlot[sl] = 0
				}
			}
		}
		if !g.open {
			s.freeGroup(jb.gid)
		}
	}
	if jb.released == 0 {
		s.drv.CascadeDone(&jb.j)
		return
	}
	// The pins of the blocks Revoke took back are released already.
	j := jb.j
	j.Keys = make([]offload.Key, 0, len(j.Keys)-int(jb.released))
	j.Slots = make([]int64, 0, cap(j.Keys))
	for i, sl := range jb.j.Slots {
		if !claims.Revoked(i) {
			j.Keys, j.Slots = append(j.Keys, jb.j.Keys[i]), append(j.Slots, sl)
		}
	}
	s.drv.CascadeDone(&j)
}

// Pinned returns the slots the cascades in flight pin (once per cascade)
// and the budget in slots (0: unbounded).
func (s *Stack) Pinned() (pinned, budget int) { return s.pinned, s.maxPinned }
