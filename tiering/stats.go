package tiering

import (
	"time"

	"github.com/kvtier/kvtier/cpu"
	"github.com/kvtier/kvtier/offload"
)

// Stats is a snapshot of the manager's counters and gauges for metrics.
type Stats struct {
	Primary cpu.Stats
	Tiers   []TierStats
	// JobsInFlight counts submitted jobs without a result yet.
	JobsInFlight int
	// PendingPromotions counts keys reserved for promotion and not yet
	// submitted (they are submitted at ScheduleEnd).
	PendingPromotions int
	// Requests counts requests with state in the manager.
	Requests int
	// StaleResults counts results for jobs issued before the last Reset.
	StaleResults uint64
	// CascadePinned is the number of primary slots the cascades in flight
	// pin (a block cascaded to several tiers counts once); CascadeBudget
	// bounds it (0: unbounded).
	CascadePinned, CascadeBudget int
	// DeferredCascades and DeferredBlocks are the cascades waiting for
	// the pin budget and their blocks (BudgetConfig.MaxDeferred bounds
	// the blocks).
	DeferredCascades, DeferredBlocks int
}

// TierStats are one secondary tier's counters (monotonic) and gauges.
type TierStats struct {
	Name     string
	Type     string
	Medium   offload.Medium
	Locality offload.Locality

	// Lookup answers of the tier, and lookups that did not ask the tier
	// because the request's load filter excludes it.
	Hits, Misses, Retries uint64
	SkippedByFilter       uint64

	// Promotions: started (slot reserved), rejected because the primary
	// was full, and finished jobs by outcome (a partial load counts as
	// failed; its loaded prefix counts in PromotedBlocks).
	PromotionsStarted     uint64
	PromotionsRejected    uint64
	PromotionsOK          uint64
	PromotionsFailed      uint64
	PromotedBlocks        uint64
	PromotionBlocksFailed uint64

	// Cascades (stores to the tier): finished jobs by outcome, jobs
	// dropped (not carried out: the blocks stay in the primary only) and
	// cascades the request's store filter excluded. DroppedBy splits
	// CascadesDropped by reason (see DropReason). CascadeBlocksDropped
	// also counts the blocks a tier refused from a cascade it otherwise
	// ran (offload.JobResult.Refused: a cluster node down).
	CascadesOK              uint64
	CascadesFailed          uint64
	CascadesDropped         uint64
	CascadeBlocksDropped    uint64
	DroppedBy               [NumDropReasons]uint64
	CascadesSkippedByFilter uint64
	CascadedBlocks          uint64
	// CascadesDeferred counts cascades the pin budget could not take when
	// they came, which waited for it (BudgetConfig.MaxDeferred) instead of
	// being dropped; each ends later as a job or as a DropEvicted drop.
	CascadesDeferred uint64
	// CascadeBlocksRevoked counts blocks that eviction took back from
	// this tier's cascades in flight (offload.BlockClaimer), one per job:
	// the tier stored them only if it had written them by then. They are
	// not in CascadedBlocks.
	CascadeBlocksRevoked uint64

	// BytesIn were loaded from the tier, BytesOut stored to it, as the
	// tier reported.
	BytesIn, BytesOut uint64

	// Back-pressure state and the latency average behind it (from a job's
	// submission to its result, queue wait included).
	UnderPressure     bool
	CascadeLatencyEMA time.Duration

	// Gauges: cascades in flight and the primary slots they pin, the
	// tier's share of the pin budget (0: unbounded), and the jobs queued
	// in the tier and its queue capacity (0 for tiers without a queue or
	// with an unbounded one).
	CascadesInFlight int
	PinnedSlots      int
	PinBudget        int
	Queued           int
	QueueCapacity    int

	// LoadLatency and StoreLatency are the latency histograms of
	// promotions and cascades, from submission to result.
	LoadLatency, StoreLatency *Histogram

	// Misbehaviour: panics recovered, results for jobs it was not given.
	Panics      uint64
	UnknownJobs uint64
}

// Stats returns a snapshot of the manager's and the primary's counters.
func (m *Manager) Stats() Stats {
	s := Stats{
		Tiers:             m.stack.Stats(),
		JobsInFlight:      m.stack.InFlight(),
		PendingPromotions: m.pendingPromos,
		Requests:          len(m.reqs),
		StaleResults:      m.stack.staleResults,
	}
	s.CascadePinned, s.CascadeBudget = m.stack.Pinned()
	s.DeferredCascades, s.DeferredBlocks = m.stack.Deferred()
	if !m.closed {
		s.Primary = m.primary.Stats()
	}
	return s
}
