package server

import (
	"time"

	"github.com/kvtier/kvtier/cpu"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/tiering"
)

// Stats are the counters of one namespace, read at Stats calls and at
// metric scrapes (never on the hot path).
type Stats struct {
	Namespace      string
	Primary        PrimaryStats
	Tiers          []TierStats // lookup order
	ActiveRequests int
	// EventsPublished counts events handed to the sink, EventsDropped
	// events it refused.
	EventsPublished, EventsDropped uint64
	// SinkEventsPublished and SinkBatchesDropped are the sink's own
	// counters: events it sent, batches it dropped on overflow.
	SinkEventsPublished, SinkBatchesDropped uint64
	// CascadePinned is the number of primary slots the cascades in flight
	// pin; CascadeBudget bounds it (0: unbounded). Revocations counts
	// blocks held only by cascades that eviction reached and asked to
	// release (withdrawing their queued cascades).
	CascadePinned, CascadeBudget int64
	Revocations                  uint64
	// Prefetch counts routers' and agents' prefetches, Pins their pins
	// (steer.go).
	Prefetch tiering.PrefetchStats
	Pins     tiering.PinStats
	// Deleted counts the blocks Delete removed, by tier ("primary" for the
	// primary).
	Deleted map[string]uint64
	// DeferredBlocks are the blocks of the cascades waiting for the pin
	// budget (tiering.BudgetConfig.MaxDeferred).
	DeferredBlocks int64
	// Sessions counts the sessions holding requests here;
	// ExpiredRequests the requests released after RequestIdleTimeout,
	// ReleasedRequests those released because their session ended, and
	// AutoSteps the steps the daemon ended on an idle engine's behalf.
	Sessions                          int
	ExpiredRequests, ReleasedRequests uint64
	AutoSteps                         uint64
	// RefusedFull and RefusedSession count new requests refused because
	// the namespace held Limits.MaxRequests, or their session
	// Limits.MaxSessionRequests.
	RefusedFull, RefusedSession uint64
	// LoadsMissing counts keys PrepareLoad found no longer readable
	// (evicted since the Lookup that answered HIT): misses, not errors,
	// with allow_missing.
	LoadsMissing uint64
	// Shares are the primary's owners (cpu.Primary.Shares): the tenants'
	// occupancy and evictions.
	Shares []cpu.ShareStats
}

// PrimaryStats are the primary tier's counters and gauges.
type PrimaryStats struct {
	SlotSize, NumSlots                   int64
	UsedSlots, PendingSlots, PinnedSlots int64
	RevocableSlots, LeasedSlots          int64
	Lookups, Hits, Misses, Evictions     uint64
	StoresRejected                       uint64
}

// TierStats are one secondary tier's counters and gauges.
type TierStats struct {
	Name     string
	Type     string
	Medium   offload.Medium
	Locality offload.Locality

	Hits, Misses, Retries, SkippedByFilter      uint64
	PromotionsOK, PromotionsFailed              uint64
	CascadesOK, CascadesFailed, CascadesDropped uint64
	CascadesFiltered                            uint64
	// DroppedBy splits CascadesDropped by tiering.DropReason.
	DroppedBy [tiering.NumDropReasons]uint64
	// CascadeBlocksRevoked counts blocks eviction took back from the
	// tier's cascades in flight (tiering.TierStats).
	CascadeBlocksRevoked uint64
	// CascadesDeferred counts cascades that waited for the pin budget
	// rather than being dropped (tiering.TierStats).
	CascadesDeferred uint64
	// Gauges: primary slots the tier's cascades in flight pin and the
	// tier's share of the budget (0: unbounded); jobs queued in the tier
	// and its queue capacity (0: no queue or unbounded).
	PinnedSlots, PinBudget int64
	Queued, QueueCapacity  int64
	BytesIn, BytesOut      uint64
	UnderPressure          bool
	// CascadeLatencyEMA is the cascade latency average behind
	// back-pressure (submission to result).
	CascadeLatencyEMA time.Duration
	// OccupancyBlocks is the number of blocks the tier holds and
	// OccupancyBytes their size (-1 when the tier does not know);
	// Evictions counts blocks it evicted.
	OccupancyBlocks, OccupancyBytes int64
	Evictions                       uint64
	// LoadLatency and StoreLatency are job latency histograms (promotions
	// and cascades); nil when the manager does not record them.
	LoadLatency, StoreLatency *Histogram
	// CorruptBlocks counts blocks that failed verification on load and
	// CorruptDeleted those the tier then deleted; both stay zero for
	// tiers that do not verify what they read (memory).
	CorruptBlocks, CorruptDeleted uint64
	// Remote holds the figures of a tier with a notion of server health
	// (redis, s3); nil for the others, which are always healthy.
	Remote *RemoteTierStats
	// Shares are the tenants' parts of a tier whose capacity is divided
	// between them (quota.tiers of fs, memory, redis or s3 tiers).
	Shares []offload.ShareReport
}

// RemoteTierStats are the figures a tier talking to servers keeps (see
// offload.RemoteReport).
type RemoteTierStats = offload.RemoteReport

// NodeHealth is one node of a clustered remote tier, or one peer of a
// peer tier.
type NodeHealth = offload.NodeReport

// NodeIndex is the state of a peer tier's index of one peer.
type NodeIndex = offload.NodeIndex

// Histogram is a cumulative histogram in seconds, Prometheus style.
type Histogram = tiering.Histogram
