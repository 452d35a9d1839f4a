package server

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"os"

	"github.com/kvtier/kvtier/cpu"
	"github.com/kvtier/kvtier/cpu/arena"
	"github.com/kvtier/kvtier/events"
	"github.com/kvtier/kvtier/keyspace"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/tiering"
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
		Stats: func() Stats {
			st := statsOf(m)
			st.Shares = p.Shares()
			return st
		},
		Blocks: p.Keys,
		Quota: func(space uint64) int {
			if q := p.Quotas(); q != nil {
				return q[p.OwnerOfSpace(space)]
			}
			return 0
		},
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

// healthReporter is implemented by tiers that talk to a server and stop
// using it while it is down, without an offload.Reporter of their own.
type healthReporter interface{ Healthy() bool }

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
		Tiers:          make([]TierStats, len(ts.Tiers)),
		CascadePinned:  int64(ts.CascadePinned),
		CascadeBudget:  int64(ts.CascadeBudget),
		DeferredBlocks: int64(ts.DeferredBlocks),
		Revocations:    p.Revocations,
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
			CascadesDeferred:     t.CascadesDeferred,
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

// tierDetails adds to out the figures only some kinds of tier keep: what
// the tier reports of itself (offload.Reporter), or at least its health.
func tierDetails(out *TierStats, t offload.SecondaryTier) {
	r, ok := t.(offload.Reporter)
	if !ok {
		if h, ok := t.(healthReporter); ok {
			out.Remote = &RemoteTierStats{Healthy: h.Healthy()}
		}
		return
	}
	rep := r.Report()
	out.OccupancyBlocks, out.OccupancyBytes, out.Evictions = rep.OccupancyBlocks, rep.OccupancyBytes, rep.Evictions
	out.CorruptBlocks, out.CorruptDeleted = rep.CorruptBlocks, rep.CorruptDeleted
	out.Remote = rep.Remote
	out.Shares = rep.Shares
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

// WithPublishers is WithPublisher with publishers of their own for some
// key spaces (tenants' events.endpoint): a block of such a space is
// published there only, every other one on p. Each publisher keeps its own
// sequence, replay and token metadata.
func WithPublishers(nc NamespaceConfig, p *events.Publisher, own map[uint64]*events.Publisher) NamespaceConfig {
	nc = WithPublisher(nc, p)
	if len(own) == 0 {
		return nc
	}
	sp := &splitPublisher{shared: p, own: own}
	nc.Events = sp
	nc.Meta = sp
	nc.EventStats = func() (published, dropped uint64) {
		for _, q := range sp.all() {
			st := q.Stats()
			published += st.EventsPublished
			dropped += st.BatchesDropped + st.SubscriberDrops
		}
		return published, dropped
	}
	return nc
}

// splitPublisher sends each key's events to its space's publisher.
type splitPublisher struct {
	shared *events.Publisher
	own    map[uint64]*events.Publisher
}

func (sp *splitPublisher) of(k offload.Key) *events.Publisher {
	if id, ok := keyspace.IDOf(k); ok {
		if q := sp.own[id]; q != nil {
			return q
		}
	}
	return sp.shared
}

func (sp *splitPublisher) all() []*events.Publisher {
	out := []*events.Publisher{sp.shared}
	for _, q := range sp.own {
		out = append(out, q)
	}
	return out
}

// Publish splits evs by publisher, keeping their order, and publishes each
// part (a step's batch on every publisher that has events of it).
func (sp *splitPublisher) Publish(evs []offload.Event) error {
	order, parts := splitEvents(evs, sp.of)
	var errs []error
	for _, q := range order {
		if err := q.Publish(parts[q]); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// splitEvents divides evs between the destinations of of: each event's
// keys, in order, go to copies of it for their destination (a run of keys
// with one destination stays one event). order lists the destinations in
// the order they first appear.
func splitEvents[D comparable](evs []offload.Event, of func(offload.Key) D) (order []D, parts map[D][]offload.Event) {
	parts = map[D][]offload.Event{}
	for _, e := range evs {
		var cur D
		for i, k := range e.Keys {
			d := of(k)
			if i == 0 || d != cur {
				if _, seen := parts[d]; !seen {
					order = append(order, d)
				}
				part := e
				part.Keys = nil
				parts[d] = append(parts[d], part)
				cur = d
			}
			last := &parts[d][len(parts[d])-1]
			last.Keys = append(last.Keys, k)
		}
	}
	return order, parts
}

// Record attaches token metadata on the key's publisher.
func (sp *splitPublisher) Record(key offload.Key, bm BlockMeta) error {
	return trackerMeta{sp.of(key).Tracker()}.Record(key, bm)
}

// Close closes every publisher, the shared one last.
func (sp *splitPublisher) Close(ctx context.Context) error {
	var errs []error
	for _, q := range sp.own {
		errs = append(errs, q.Close(ctx))
	}
	errs = append(errs, sp.shared.Close(ctx))
	return errors.Join(errs...)
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
