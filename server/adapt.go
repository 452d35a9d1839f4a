package server

import (
	"fmt"
	"math"
	"net"
	"os"

	"github.com/kvtier/kvtier/cpu"
	"github.com/kvtier/kvtier/cpu/arena"
	"github.com/kvtier/kvtier/events"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/tiering"
	"github.com/kvtier/kvtier/tiers/fs"
	"github.com/kvtier/kvtier/tiers/peer"
	"github.com/kvtier/kvtier/tiers/redis"
	"github.com/kvtier/kvtier/tiers/remote"
)

// ManagerNamespace returns the configuration of a namespace served by m
// over primary p (the primary m was built with). Its Stats read m's and
// p's counters; GetArena can hand out p's arena when it is a file or memfd
// arena.
func ManagerNamespace(name string, m *tiering.Manager, p *cpu.Primary, parser offload.Parser) NamespaceConfig {
	nc := NamespaceConfig{
		Name:    name,
		Manager: m,
		Arena:   p.Arena(),
		Parser:  parser,
		Stats:   func() Stats { return statsOf(m) },
		Blocks:  p.Keys,
	}
	if a := p.SlotArena(); a != nil && a.File() != nil {
		nc.Share = sharedArena{a}
	}
	return nc
}

// sharedArena adapts a cpu/arena.Arena to SharedArena.
type sharedArena struct{ a *arena.Arena }

func (s sharedArena) Kind() string   { return string(s.a.Kind()) }
func (s sharedArena) Path() string   { return s.a.Path() }
func (s sharedArena) File() *os.File { return s.a.File() }

// occupancy is implemented by tiers that know how many blocks they hold.
type occupancy interface{ Len() int }

// evictionCounter is implemented by tiers that count the blocks they
// evicted (memory).
type evictionCounter interface{ Evictions() uint64 }

// healthReporter is implemented by tiers that talk to a server and stop
// using it while it is down (tiers/remote.Base: redis, s3).
type healthReporter interface{ Healthy() bool }

// remoteStats is implemented by tiers whose Stats are tiers/remote's
// (s3). The redis tier returns its own Stats, which embed them.
type remoteStats interface{ Stats() remote.Stats }

func statsOf(m *tiering.Manager) Stats {
	ts := m.Stats()
	p := ts.Primary
	st := Stats{
		Primary: PrimaryStats{
			SlotSize: int64(p.SlotSize), NumSlots: int64(p.NumSlots),
			UsedSlots: int64(p.Blocks), PendingSlots: int64(p.Pending), PinnedSlots: int64(p.Pinned),
			RevocableSlots: int64(p.Revocable), LeasedSlots: int64(p.Leased),
			Lookups: p.Lookups, Hits: p.Hits, Misses: p.Misses, Evictions: p.Evictions,
			StoresRejected: p.RejectedStores,
		},
		Tiers:         make([]TierStats, len(ts.Tiers)),
		CascadePinned: int64(ts.CascadePinned),
		CascadeBudget: int64(ts.CascadeBudget),
		Revocations:   p.Revocations,
	}
	st.Tiers = tierStatsOf(ts.Tiers, m.Tiers(), int64(p.SlotSize))
	return st
}

// tierStatsOf converts a stack's tier counters, adding what only some
// kinds of tier keep (tiers co-indexed with ts; slotSize sizes the blocks
// of tiers that count blocks only).
func tierStatsOf(ts []tiering.TierStats, tiers []offload.SecondaryTier, slotSize int64) []TierStats {
	out := make([]TierStats, len(ts))
	for i, t := range ts {
		o := TierStats{
			Name: t.Name, Type: t.Type, Medium: t.Medium, Locality: t.Locality,
			Hits: t.Hits, Misses: t.Misses, Retries: t.Retries, SkippedByFilter: t.SkippedByFilter,
			PromotionsOK: t.PromotionsOK, PromotionsFailed: t.PromotionsFailed,
			CascadesOK: t.CascadesOK, CascadesFailed: t.CascadesFailed,
			CascadesDropped: t.CascadesDropped, CascadesFiltered: t.CascadesSkippedByFilter,
			BytesIn: t.BytesIn, BytesOut: t.BytesOut, UnderPressure: t.UnderPressure,
			CascadeLatencyEMA:    t.CascadeLatencyEMA,
			DroppedBy:            t.DroppedBy,
			CascadeBlocksRevoked: t.CascadeBlocksRevoked,
			PinnedSlots:          int64(t.PinnedSlots), PinBudget: int64(t.PinBudget),
			Queued: int64(t.Queued), QueueCapacity: int64(t.QueueCapacity),
			LoadLatency: t.LoadLatency, StoreLatency: t.StoreLatency,
			OccupancyBlocks: -1, OccupancyBytes: -1,
		}
		if i < len(tiers) {
			tierDetails(&o, tiers[i])
		}
		if o.OccupancyBytes < 0 && o.OccupancyBlocks >= 0 {
			o.OccupancyBytes = o.OccupancyBlocks * slotSize
		}
		out[i] = o
	}
	return out
}

// tierDetails adds to out the figures only some kinds of tier keep.
func tierDetails(out *TierStats, t offload.SecondaryTier) {
	var rs *remote.Stats
	switch t := t.(type) {
	case *fs.Tier:
		fst := t.Stats()
		out.OccupancyBlocks, out.OccupancyBytes, out.Evictions = int64(fst.Files), fst.UsedBytes, fst.EvictedBlocks
		// The fs tier deletes every block file that fails verification.
		out.CorruptBlocks, out.CorruptDeleted = fst.CorruptBlocks, fst.CorruptBlocks
	case *peer.Tier:
		// Healthy while some peer answers; each peer is a node in /metrics.
		out.Remote = &RemoteTierStats{}
		for _, p := range t.Peers() {
			out.CorruptBlocks += uint64(p.Corrupt)
			out.Remote.Healthy = out.Remote.Healthy || p.Healthy
			out.Remote.Nodes = append(out.Remote.Nodes, NodeHealth{Addr: p.Name, Healthy: p.Healthy,
				Index: &NodeIndex{Current: p.Indexed, Blocks: p.IndexKeys, Gaps: p.Gaps}})
		}
		return
	case *redis.Tier:
		full := t.Stats()
		rs = &full.Stats
		// Blocks the server itself evicted, expired or deleted (keyspace
		// events): the tier's evictions.
		out.Evictions = uint64(full.ServerRemoved)
	case remoteStats:
		s := t.Stats()
		rs = &s
	case occupancy:
		out.OccupancyBlocks = int64(t.Len())
	}
	if e, ok := t.(evictionCounter); ok {
		out.Evictions = e.Evictions()
	}
	if h, ok := t.(healthReporter); ok {
		out.Remote = &RemoteTierStats{Healthy: h.Healthy()}
	}
	if rs == nil {
		return
	}
	if out.Remote == nil {
		out.Remote = &RemoteTierStats{Healthy: rs.Healthy}
	}
	out.Remote.LookupsUnhealthy = uint64(rs.LookupsUnhealthy)
	out.Remote.LoadJobsSkipped, out.Remote.StoreJobsSkipped = uint64(rs.LoadJobsSkipped), uint64(rs.StoreJobsSkipped)
	out.Remote.ReconciledRemovals, out.Remote.ReconcileFailures = uint64(rs.ReconciledRemovals), uint64(rs.ReconcileFailures)
	if rt, ok := t.(*redis.Tier); ok {
		for _, n := range rt.Nodes() {
			out.Remote.Nodes = append(out.Remote.Nodes, NodeHealth{Addr: n.Addr, Healthy: n.Healthy})
		}
		out.Remote.NodeDownBlocks, out.Remote.SlotMapChanges = uint64(rs.BlocksNodeDown), uint64(rt.SlotMapReloads())
	}
	out.CorruptBlocks, out.CorruptDeleted = uint64(rs.Corrupted), uint64(rs.Deleted)
}

// WithPublisher makes p the event sink of nc: every step's events are
// published, PrepareStore's token metadata goes to p's tracker
// (self-describing events when p's tracker is configured for them), and
// p's counters appear in the metrics. Shutdown closes p after the last
// events.
func WithPublisher(nc NamespaceConfig, p *events.Publisher) NamespaceConfig {
	nc.Events = p
	nc.Meta = trackerMeta{p.Tracker()}
	nc.EventStats = func() (uint64, uint64) {
		st := p.Stats()
		return st.EventsPublished, st.BatchesDropped + st.SubscriberDrops
	}
	nc.Feed = func() EventFeed {
		f := EventFeed{NextSeq: p.NextSeq(), Topic: p.Topic(), CPUMedium: p.Tracker().MediumName(offload.MediumCPU)}
		if a, ok := p.Addr().(*net.TCPAddr); ok {
			f.Port = a.Port
		}
		if a, ok := p.ReplayAddr().(*net.TCPAddr); ok {
			f.ReplayPort = a.Port
		}
		return f
	}
	return nc
}

// trackerMeta adapts an events.Tracker to MetaRecorder.
type trackerMeta struct{ t *events.Tracker }

func (m trackerMeta) Record(key offload.Key, bm BlockMeta) error {
	tm := events.TokenMeta{
		BlockHashes: bm.BlockHashes,
		ParentHash:  bm.ParentHash,
		TokenIDs:    make([]uint32, len(bm.TokenIDs)),
		BlockSize:   bm.BlockSize,
		SpecKind:    bm.SpecKind,
	}
	for i, id := range bm.TokenIDs {
		if id < 0 || id > math.MaxUint32 {
			return fmt.Errorf("token_ids[%d] = %d: out of range", i, id)
		}
		tm.TokenIDs[i] = uint32(id)
	}
	if bm.LoraID != nil {
		tm.LoraID = int(*bm.LoraID)
	}
	if bm.LoraName != nil {
		tm.LoraName = *bm.LoraName
	}
	if bm.SlidingWindow != nil {
		tm.SlidingWindow = int(*bm.SlidingWindow)
	}
	_, err := m.t.Record(key, tm)
	return err
}
