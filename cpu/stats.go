package cpu

import "math/bits"

// allocBuckets is the number of power-of-two buckets of the allocation
// size histogram: 1, 2, 3–4, 5–8, …, and a last bucket for larger sizes.
const allocBuckets = 12

type counters struct {
	lookups, hits, misses uint64
	evictions             uint64
	storedBlocks          uint64
	failedStores          uint64
	rejectedStores        uint64
	skippedStores         uint64
	loads                 uint64
	revocations           uint64
}

// Stats is a snapshot of the tier's gauges and cumulative counters.
// Counters only grow (Reset keeps them), as metrics exporters expect.
type Stats struct {
	NumSlots  int
	SlotSize  int
	Blocks    int // keys held, pending or ready
	Pending   int // stores in flight (ref −1)
	Pinned    int // ready blocks with readers (ref > 0)
	Evictable int // ready blocks without readers (ref 0)
	// Revocable counts the pinned blocks held by soft pins only: eviction
	// may take them once the Revoker releases the pins.
	Revocable int
	// Leased counts slots leased to an engine (no key yet).
	Leased    int
	FreeSlots int

	// Usage is the fraction of slots that cannot be evicted (pending or
	// pinned), split into WriteUsage (pending) and ReadUsage (pinned).
	Usage, WriteUsage, ReadUsage float64

	Lookups uint64
	Hits    uint64 // Hit or HitPending
	Misses  uint64
	// Evictions counts evicted blocks.
	Evictions uint64
	// StoredBlocks and FailedStores count blocks whose store completed
	// with success or failure; RejectedStores counts PrepareStore calls
	// that could not make room.
	StoredBlocks   uint64
	FailedStores   uint64
	RejectedStores uint64
	// SkippedStores counts keys dropped from PrepareStore by the reuse
	// filter (vLLM resets this on read; here it only grows).
	SkippedStores uint64
	// Loads counts blocks pinned by PrepareLoad.
	Loads uint64
	// Revocations counts blocks held by soft pins that eviction asked the
	// Revoker to release.
	Revocations uint64
	// AllocSizes is a histogram of the number of new blocks per
	// PrepareStore that needed slots (counted even when it then failed):
	// bucket i holds sizes in (2^(i−1), 2^i], the last bucket everything
	// larger.
	AllocSizes [allocBuckets]uint64
}

// Stats returns a snapshot of the tier's gauges and counters.
func (p *Primary) Stats() Stats {
	n := int(p.numSlots)
	st := Stats{
		NumSlots:       n,
		SlotSize:       p.slotSize,
		Blocks:         p.numBlocks,
		Pending:        p.numPending,
		Evictable:      p.numEvictable,
		Revocable:      p.numRevocable,
		Leased:         p.numLeased,
		Pinned:         p.numBlocks - p.numPending - p.numEvictable,
		FreeSlots:      n - p.numBlocks - p.numLeased,
		Lookups:        p.ctr.lookups,
		Hits:           p.ctr.hits,
		Misses:         p.ctr.misses,
		Evictions:      p.ctr.evictions,
		StoredBlocks:   p.ctr.storedBlocks,
		FailedStores:   p.ctr.failedStores,
		RejectedStores: p.ctr.rejectedStores,
		SkippedStores:  p.ctr.skippedStores,
		Loads:          p.ctr.loads,
		Revocations:    p.ctr.revocations,
		AllocSizes:     p.allocHist,
	}
	if n > 0 {
		st.Usage = float64(st.Pending+st.Pinned+st.Leased) / float64(n)
		st.WriteUsage = float64(st.Pending+st.Leased) / float64(n)
		st.ReadUsage = max(st.Usage-st.WriteUsage, 0)
	}
	return st
}

func (p *Primary) recordAllocation(n int) {
	b := bits.Len(uint(n - 1)) // 1→0, 2→1, 3..4→2, 5..8→3, …
	p.allocHist[min(b, allocBuckets-1)]++
}
