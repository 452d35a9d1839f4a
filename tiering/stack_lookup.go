// Lookup and promotion: a key is asked of the tiers in order, the filter
// deciding per tier; the first hit names the tier a promotion loads from,
// and Load submits that promotion as a job of the tier.

package tiering

import (
	"math/bits"
	"slices"
	"time"

	"github.com/kvtier/kvtier/offload"
)

// PromotionSource returns the name of the tier a promotion job in flight
// is loading key from. It scans the jobs: for tools, not the hot path.
func (s *Stack) PromotionSource(key offload.Key) (string, bool) {
	for _, j := range s.jobs {
		if j.gid == 0 && j.j.Promotion && slices.Contains(j.j.Keys, key) {
			return j.tier.name, true
		}
	}
	return "", false
}

// Lookup asks each tier req's load filter allows, in order, whether it
// holds key; a tier the filter excludes is not called. It returns Hit and
// the index of the first tier that holds key, Retry when no tier holds it
// but one is not sure yet, or Miss (index -1 for both).
//
// A tier's miss is counted only when the answer is final (Hit or Miss): while
// another tier is not sure yet the key is asked again, and a tier that
// missed each time would count one miss per ask.
func (s *Stack) Lookup(key offload.Key, req *offload.ReqContext) (offload.LookupResult, int) {
	filter := req.LoadFilter
	retry := false
	var missed uint64 // tiers (by index, the first 64) that answered Miss
	for _, ts := range s.tiers {
		if !filter.Allows(ts.medium, ts.locality) {
			ts.stats.SkippedByFilter++
			continue
		}
		switch s.tierLookup(ts, key, req) {
		case offload.Hit:
			ts.stats.Hits++
			s.countMisses(missed)
			return offload.Hit, ts.idx
		case offload.Retry, offload.HitPending:
			// A tier has no pending state of its own to report; treat
			// HitPending as "not sure yet".
			ts.stats.Retries++
			retry = true
		default:
			if ts.idx < 64 {
				missed |= 1 << ts.idx
			} else {
				ts.stats.Misses++
			}
		}
	}
	if retry {
		return offload.Retry, -1
	}
	s.countMisses(missed)
	return offload.Miss, -1
}

// countMisses counts a miss for each tier of the mask (by index).
func (s *Stack) countMisses(mask uint64) {
	for ; mask != 0; mask &= mask - 1 {
		s.tiers[bits.TrailingZeros64(mask)].stats.Misses++
	}
}

// Load submits a promotion of keys from tier i into slots (co-indexed),
// which the driver has reserved, and returns its job id. Its outcome
// reaches Driver.PromotionDone.
func (s *Stack) Load(i int, keys []offload.Key, slots []int64, req *offload.ReqContext) uint64 {
	return s.LoadInto(s.arena, i, keys, slots, req)
}

// LoadInto is Load into the slots of arena a instead of the stack's
// arena: in tier mode each engine's jobs address its own region.
func (s *Stack) LoadInto(a offload.Arena, i int, keys []offload.Key, slots []int64, req *offload.ReqContext) uint64 {
	ts := s.tiers[i]
	jb := s.initJob(new(job), ts, keys, slots, true, req, time.Now())
	jb.j.Arena = a
	if !s.tierSubmit(ts, &jb.j) {
		s.failSubmitted(jb, "submit load panicked")
	}
	return jb.j.ID
}
