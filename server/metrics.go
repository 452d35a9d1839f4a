package server

import (
	"context"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/kvtier/kvtier/explain"
	"github.com/kvtier/kvtier/region"
	"github.com/kvtier/kvtier/tiering"
)

// metrics owns the daemon's Prometheus registry. Manager and tier counters
// are read at scrape time by a collector (no cost on the hot path); only
// the per-call API metrics and the filter-warning counter are updated as
// things happen.
type metrics struct {
	reg            *prometheus.Registry
	filterWarnings *prometheus.CounterVec
	calls          *prometheus.CounterVec
	callSeconds    *prometheus.HistogramVec
	streamCalls    *prometheus.CounterVec
	authRefusals   *prometheus.CounterVec
	holdRefusals   *prometheus.CounterVec
	// receiveRefusals counts calls turned away by the receive budget
	// (receive.go).
	receiveRefusals *prometheus.CounterVec
	streamBlocks    *prometheus.CounterVec
	// The three series of streamBlocks, resolved once: they count every
	// block on the stream.
	streamOut, streamIn, streamRejected prometheus.Counter
}

func newMetrics() *metrics {
	m := &metrics{reg: prometheus.NewRegistry()}
	m.filterWarnings = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvtier_filter_warnings_total",
		Help: "Lenient-mode problems found in kv_load_tiers / kv_store_tiers, by reason.",
	}, []string{"reason"})
	m.calls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvtier_api_calls_total",
		Help: "API calls by method and gRPC status code.",
	}, []string{"method", "code"})
	m.callSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "kvtier_api_call_duration_seconds",
		Help:    "API call latency inside the daemon, by method.",
		Buckets: prometheus.ExponentialBuckets(10e-6, 4, 10), // 10µs .. 2.6s
	}, []string{"method"})
	m.streamCalls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvtier_stream_requests_total",
		Help: "Block-stream requests by kind (get and put from peers or engines, push from peers' tiers; get_blocks and put_blocks are clients' by-value calls) and result (ok, failed: answered with an error).",
	}, []string{"kind", "result"})
	m.authRefusals = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvtier_auth_refusals_total",
		Help: "Strangers turned away before they cost anything, by listener (tcp and unix: the API, stream: the block stream, arena: the arena side channel) and reason (token: a call without a valid token or a mapped uid, refused before its body was read; timeout: a connection that did not authenticate within server.auth_timeout, closed; evicted: one closed to make room at server.max_connections (or its host's max_connections_per_peer) for a new one; per_peer: a new connection refused, its host having its share of connections, all authenticated; ticket: a side-channel request without a good ticket).",
	}, []string{"listener", "reason"})
	m.holdRefusals = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvtier_tenant_hold_refusals_total",
		Help: "Block-stream requests of a tenant refused because the primary slots its requests in flight keep pinned or reserved would pass its quota (holds.go).",
	}, []string{"namespace"})
	m.receiveRefusals = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvtier_receive_refusals_total",
		Help: "API calls refused or cancelled by the receive budget, by reason (busy: refused before its request was read, limits.max_receive_bytes being reserved and too many calls waiting; timeout: cancelled, its request not whole within limits.receive_timeout).",
	}, []string{"reason"})
	// Both series from the start, at zero: an alert's rate needs them.
	m.receiveRefusals.WithLabelValues("busy")
	m.receiveRefusals.WithLabelValues("timeout")
	m.streamBlocks = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvtier_stream_blocks_total",
		Help: "Blocks moved on the block stream by direction (out: sent, in: received) and result (ok; rejected: a received block of the wrong size or that failed its checksum, not stored).",
	}, []string{"direction", "result"})
	m.streamOut = m.streamBlocks.WithLabelValues("out", "ok")
	m.streamIn = m.streamBlocks.WithLabelValues("in", "ok")
	m.streamRejected = m.streamBlocks.WithLabelValues("in", "rejected")
	return m
}

func (m *metrics) register(s *Server) {
	m.reg.MustRegister(m.filterWarnings, m.calls, m.callSeconds, m.streamCalls, m.streamBlocks, m.authRefusals, m.holdRefusals, m.receiveRefusals,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "kvtier_receive_bytes_reserved",
			Help: "Request bytes reserved by API calls being received (each reserves limits.max_message_bytes until its request is decoded), at most limits.max_receive_bytes.",
		}, func() float64 { return float64(s.recvBudget.Used()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "kvtier_receive_waiting",
			Help: "API calls waiting for a reservation of the receive budget before their request is read.",
		}, func() float64 { return float64(s.recvBudget.Waiting()) }),
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		&collector{s: s})
}

func (m *metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}

func (m *metrics) unaryInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	start := time.Now()
	resp, err := h(ctx, req)
	method := info.FullMethod[strings.LastIndexByte(info.FullMethod, '/')+1:]
	m.callSeconds.WithLabelValues(method).Observe(time.Since(start).Seconds())
	m.calls.WithLabelValues(method, status.Code(err).String()).Inc()
	return resp, err
}

var (
	tierLabels = []string{"namespace", "tier", "type", "medium", "locality"}

	descPrimarySlots = prometheus.NewDesc("kvtier_primary_slots", "Primary tier slots by state (total, used, pending, pinned).", []string{"namespace", "state"}, nil)
	descPrimarySlot  = prometheus.NewDesc("kvtier_primary_slot_bytes", "Bytes per primary slot (= per block).", []string{"namespace"}, nil)
	descPrimaryLook  = prometheus.NewDesc("kvtier_primary_lookups_total", "Primary tier lookups by result.", []string{"namespace", "result"}, nil)
	descPrimaryEvict = prometheus.NewDesc("kvtier_primary_evictions_total", "Blocks evicted from the primary tier.", []string{"namespace"}, nil)
	descPrimaryRej   = prometheus.NewDesc("kvtier_primary_stores_rejected_total", "PrepareStore calls that could not make room.", []string{"namespace"}, nil)

	descTierLookups   = prometheus.NewDesc("kvtier_tier_lookups_total", "Secondary tier lookups by result (hit, miss, retry).", append(tierLabels, "result"), nil)
	descTierSkipped   = prometheus.NewDesc("kvtier_tier_lookups_skipped_total", "Lookups not sent to the tier because the request's load filter excluded it.", tierLabels, nil)
	descTierPromos    = prometheus.NewDesc("kvtier_tier_promotions_total", "Promotions from the tier into the primary, by result (ok, failed).", append(tierLabels, "result"), nil)
	descTierCascades  = prometheus.NewDesc("kvtier_tier_cascades_total", "Cascades from the primary to the tier, by result (ok, failed, dropped by back-pressure, filtered by the store filter).", append(tierLabels, "result"), nil)
	descTierBytes     = prometheus.NewDesc("kvtier_tier_bytes_total", "Bytes moved between the primary and the tier (in = promotions, out = cascades).", append(tierLabels, "direction"), nil)
	descTierPressure  = prometheus.NewDesc("kvtier_tier_under_pressure", "1 while back-pressure drops cascades to the tier.", tierLabels, nil)
	descTierBlocks    = prometheus.NewDesc("kvtier_tier_blocks", "Blocks held by the tier (occupancy).", tierLabels, nil)
	descTierHeld      = prometheus.NewDesc("kvtier_tier_bytes_held", "Bytes the tier holds (tiers that know: fs, memory).", tierLabels, nil)
	descTierEvictions = prometheus.NewDesc("kvtier_tier_evictions_total", "Blocks evicted by the tier.", tierLabels, nil)
	descTierJobs      = prometheus.NewDesc("kvtier_tier_job_duration_seconds", "Tier job latency by kind (load = promotion, store = cascade).", append(tierLabels, "kind"), nil)
	descTierHealthy   = prometheus.NewDesc("kvtier_tier_healthy", "0 while a remote tier's server (redis, s3) is considered down, its lookups missing and its jobs failing without being tried; else 1. Tiers without a server (fs, memory) always report 1.", tierLabels, nil)
	descTierLookDown  = prometheus.NewDesc("kvtier_tier_lookups_unhealthy_total", "Lookups a remote tier answered miss without asking because its server was down (remote tiers only).", tierLabels, nil)
	descTierJobsSkip  = prometheus.NewDesc("kvtier_tier_jobs_skipped_total", "Jobs a remote tier refused at submission without any I/O (server down, tier closed, or too many jobs in flight), by kind (load = promotion, store = cascade); remote tiers only.", append(tierLabels, "kind"), nil)
	descTierReconRm   = prometheus.NewDesc("kvtier_tier_reconciled_removals_total", "Removed events a remote tier published late, after a reconciliation pass found blocks it had announced gone from the server (a keyspace subscription down, a server restarted empty, an object lifecycle rule); remote tiers with events only.", tierLabels, nil)
	descTierReconErr  = prometheus.NewDesc("kvtier_tier_reconcile_failures_total", "Reconciliation passes of a remote tier that could not finish (the server failed a check); they are retried.", tierLabels, nil)
	descTierNode      = prometheus.NewDesc("kvtier_tier_node_healthy", "1 while a node of a clustered remote tier (a Redis Cluster master) answers its probe, else 0.", append(tierLabels, "node"), nil)
	descStoresFull    = prometheus.NewDesc("kvtier_tier_stores_full_total", "Store jobs a redis or s3 tier with max_bytes refused for lack of room: the tenants' quotas left the storer nothing to evict (its blocks stay in the primary).", tierLabels, nil)
	descNodeDown      = prometheus.NewDesc("kvtier_tier_node_down_blocks_total", "Blocks a clustered remote tier (Redis Cluster) did not load, store or look up, without I/O, because the master of their slot was down; the other masters' blocks go on.", tierLabels, nil)
	descSlotMap       = prometheus.NewDesc("kvtier_tier_slot_map_changes_total", "Slot maps a clustered remote tier (Redis Cluster) read that differed from the previous one: failovers and reshardings it followed.", tierLabels, nil)
	descNodeIndexed   = prometheus.NewDesc("kvtier_tier_node_indexed", "1 while a peer tier answers lookups for this peer from its KV events (index current), else 0 (it asks the peer).", append(tierLabels, "node"), nil)
	descNodeIndexKeys = prometheus.NewDesc("kvtier_tier_node_index_blocks", "Blocks in a peer tier's index of this peer.", append(tierLabels, "node"), nil)
	descNodeIndexGaps = prometheus.NewDesc("kvtier_tier_node_index_gaps_total", "KV event sequence gaps a peer tier saw from this peer (filled by replay or a new pass over its blocks).", append(tierLabels, "node"), nil)
	descTierCorrupt   = prometheus.NewDesc("kvtier_tier_corrupt_blocks_total", "Blocks that failed verification when the tier read them (0 for tiers that do not verify, e.g. memory).", tierLabels, nil)
	descTierDropped   = prometheus.NewDesc("kvtier_tier_cascades_dropped_total", "Cascades to the tier not carried out (the blocks stay in the primary only), by reason: pressure (back-pressure), budget (the primary's cascade pin budget is spent), tier_budget (the tier's share of it is spent), queue_full (the tier's queue or in-flight bound was full), tier_down (its server was down), cancelled (queued, withdrawn so that an engine store could evict its blocks), tenant_budget (the share of the budget of the tenant whose blocks they are is spent), evicted (deferred for the budget, and the blocks left the primary before their turn).", append(tierLabels, "reason"), nil)
	descTierDeferred  = prometheus.NewDesc("kvtier_tier_cascades_deferred_total", "Cascades to the tier that the cascade pin budget could not take when they came and that waited for it (unpinned, in a bounded queue) instead of being dropped.", tierLabels, nil)
	descTierRevoked   = prometheus.NewDesc("kvtier_tier_cascade_blocks_revoked_total", "Blocks eviction took back from the tier's cascades in flight, one per job, so that the primary evicts them where it would without tiers (tiers that claim blocks: fs, memory, s3, redis); the tier holds them only if it had written them by then.", tierLabels, nil)
	descTierPinned    = prometheus.NewDesc("kvtier_tier_cascade_pinned_slots", "Primary slots pinned by the tier's cascades in flight.", tierLabels, nil)
	descTierPinBudget = prometheus.NewDesc("kvtier_tier_cascade_pin_budget_slots", "The tier's share of the cascade pin budget, in primary slots (0: unbounded).", tierLabels, nil)
	descTierQueued    = prometheus.NewDesc("kvtier_tier_queued_jobs", "Jobs submitted to the tier that no worker has started yet (tiers with a queue: fs, memory with concurrency).", tierLabels, nil)
	descTierQueueCap  = prometheus.NewDesc("kvtier_tier_queue_capacity", "Capacity of the tier's job queue (0: no queue or unbounded).", tierLabels, nil)
	descTierCorrDel   = prometheus.NewDesc("kvtier_tier_corrupt_blocks_deleted_total", "Corrupt blocks the tier deleted.", tierLabels, nil)

	descCascadePin  = prometheus.NewDesc("kvtier_cascade_pinned_slots", "Primary slots pinned by cascades in flight (a block cascaded to several tiers counts once).", []string{"namespace"}, nil)
	descRegionLook  = prometheus.NewDesc("kvtier_region_lookup_keys_total", "Keys vLLM tier-mode lookups answered, by answer: hit, miss, or unknown (not settled in time: the engine asks again a step later, a deferral).", []string{"namespace", "answer"}, nil)
	descRegionPromo = prometheus.NewDesc("kvtier_region_promotion_steps", "Engine steps (the region's step ends) a tier-mode promotion took from its submission to its outcome.", []string{"namespace"}, nil)
	descCascadeDef  = prometheus.NewDesc("kvtier_cascade_deferred_blocks", "Blocks of the cascades waiting for the cascade pin budget (bounded by budget.max_deferred_blocks; a full queue drops).", []string{"namespace"}, nil)
	descCascadeBud  = prometheus.NewDesc("kvtier_cascade_pin_budget_slots", "Bound on kvtier_cascade_pinned_slots (0: unbounded).", []string{"namespace"}, nil)
	descRevoked     = prometheus.NewDesc("kvtier_cascade_revocations_total", "Blocks held only by cascades that eviction reached and asked to release, withdrawing their queued cascades rather than evict a more recent block.", []string{"namespace"}, nil)
	descSessions    = prometheus.NewDesc("kvtier_sessions", "Client sessions (connections) holding requests.", []string{"namespace"}, nil)
	descRefused     = prometheus.NewDesc("kvtier_requests_refused_total", "New requests refused, by why: full (the namespace holds limits.max_requests), session_cap (the session holds limits.max_session_requests).", []string{"namespace", "why"}, nil)
	descReleased    = prometheus.NewDesc("kvtier_requests_released_total", "Requests released without their client finishing them, by why: session_ended (disconnect, crash, keep-alive), idle (no call for the request idle timeout).", []string{"namespace", "why"}, nil)
	descSideRefsd   = prometheus.NewDesc("kvtier_arena_side_channel_refused_total", "Arena side-channel connections refused at once because 256 exchanges were in flight (an idle connection is dropped after 2 s).", nil, nil)
	descLoadsMiss   = prometheus.NewDesc("kvtier_prepare_load_missing_total", "Keys PrepareLoad found no longer readable: evicted (or rewritten) by other clients' stores since the Lookup that answered HIT. With allow_missing they are misses (slot -1), else the call fails.", []string{"namespace"}, nil)
	descConns       = prometheus.NewDesc("kvtier_connections", "Client connections (sessions) open, over all listeners; compare with server.max_connections per listener.", nil, nil)
	descSessEnded   = prometheus.NewDesc("kvtier_sessions_ended_total", "Client sessions ended (disconnect, crash, keep-alive failure).", nil, nil)
	descAutoSteps   = prometheus.NewDesc("kvtier_auto_steps_total", "Steps the daemon ended itself because no engine did while tier work was pending.", []string{"namespace"}, nil)
	descRequests    = prometheus.NewDesc("kvtier_active_requests", "Active requests.", []string{"namespace"}, nil)
	descEventsPub   = prometheus.NewDesc("kvtier_events_published_total", "Offloading events handed to the event publisher.", []string{"namespace"}, nil)
	descEventsDrp   = prometheus.NewDesc("kvtier_events_dropped_total", "Offloading events the publisher refused (closed).", []string{"namespace"}, nil)
	descEventsSent  = prometheus.NewDesc("kvtier_events_sent_total", "KV events the publisher sent to its subscribers.", []string{"namespace"}, nil)
	descTenantHeld  = prometheus.NewDesc("kvtier_tenant_primary_bytes", "Primary bytes a tenant's (or shared space's) blocks hold, pending and pinned ones included.", []string{"namespace", "tenant"}, nil)
	descTenantQuota = prometheus.NewDesc("kvtier_tenant_primary_quota_bytes", "A tenant's (or shared space's) guaranteed share of the primary.", []string{"namespace", "tenant"}, nil)
	descTenantEvict = prometheus.NewDesc("kvtier_tenant_evictions_total", "A tenant's blocks evicted from the primary, by whose store: self (its own), others (another tenant's, only ever while it held more than its quota).", []string{"namespace", "tenant", "by"}, nil)
	descTenantLook  = prometheus.NewDesc("kvtier_tenant_lookups_total", "Blocks a tenant's Lookups and GetBlocks (API and block stream) looked up, by result (hit, miss).", []string{"tenant", "result"}, nil)
	descTenantStore = prometheus.NewDesc("kvtier_tenant_stored_blocks_total", "Blocks a tenant's puts stored (API and block stream).", []string{"tenant"}, nil)
	descTenantTier  = prometheus.NewDesc("kvtier_tenant_tier_bytes", "Bytes a tenant's (or shared space's) blocks hold in a secondary tier whose capacity is divided between tenants (quota.tiers of an fs, redis or s3 tier with max_bytes or a memory tier).", []string{"namespace", "tier", "tenant"}, nil)
	descTenantTierQ = prometheus.NewDesc("kvtier_tenant_tier_quota_bytes", "A tenant's (or shared space's) guaranteed share of a secondary tier.", []string{"namespace", "tier", "tenant"}, nil)
	descTenantRefsd = prometheus.NewDesc("kvtier_tenant_refusals_total", "A tenant's calls refused: permission denied (another namespace, an admin call), over a limit, no room in the primary.", []string{"tenant"}, nil)
	descPrefetches  = prometheus.NewDesc("kvtier_prefetches_total", "Prefetches of routers and agents, by result: started (accepted), completed (their run resolved: present or promoted), expired (deadline first), refused (prefetch off, or prefetch.max_queued waiting).", []string{"namespace", "result"}, nil)
	descPrefPromos  = prometheus.NewDesc("kvtier_prefetch_promotions_total", "Blocks whose promotion into the primary a prefetch started.", []string{"namespace"}, nil)
	descPrefQueued  = prometheus.NewDesc("kvtier_prefetch_queued", "Prefetches waiting for tiers that are not sure yet, or for room in their share.", []string{"namespace"}, nil)
	descPrefYield   = prometheus.NewDesc("kvtier_prefetch_blocks_yielded_total", "Prefetched blocks whose hold the engine's need for room released before their request read them.", []string{"namespace"}, nil)
	descPrefFlight  = prometheus.NewDesc("kvtier_prefetch_slots_in_flight", "Primary slots prefetch promotions hold until they land (bounded by prefetch.share).", []string{"namespace"}, nil)
	descPins        = prometheus.NewDesc("kvtier_pins_total", "Blocks routers and agents pinned (pinned), released before their TTL (unpinned), whose TTL passed (expired), or whose pin their owner's budget refused (refused).", []string{"namespace", "result"}, nil)
	descPinned      = prometheus.NewDesc("kvtier_pinned_blocks", "Blocks routers and agents pin in the primary now (bounded per owner by pins.share).", []string{"namespace"}, nil)
	descDeleted     = prometheus.NewDesc("kvtier_deleted_blocks_total", "Blocks Delete removed, by tier (primary for the primary).", []string{"namespace", "tier"}, nil)
	descBatchesDrp  = prometheus.NewDesc("kvtier_event_batches_dropped_total", "Event batches the publisher dropped because its queue or a subscriber's queue was full.", []string{"namespace"}, nil)
)

// collector reads every namespace's Stats at scrape time.
type collector struct{ s *Server }

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		descPrimarySlots, descPrimarySlot, descPrimaryLook, descPrimaryEvict, descPrimaryRej,
		descTierLookups, descTierSkipped, descTierPromos, descTierCascades, descTierBytes,
		descTierPressure, descTierBlocks, descTierHeld, descTierEvictions, descTierJobs,
		descTierHealthy, descTierLookDown, descTierJobsSkip, descTierReconRm, descTierReconErr, descTierNode, descStoresFull, descNodeDown, descSlotMap, descNodeIndexed, descNodeIndexKeys, descNodeIndexGaps, descTierCorrupt, descTierCorrDel,
		descTierDropped, descTierDeferred, descTierRevoked, descTierPinned, descTierPinBudget, descTierQueued, descTierQueueCap,
		descCascadePin, descCascadeDef, descCascadeBud, descRegionLook, descRegionPromo, descRevoked, descSessions, descConns, descSideRefsd, descSessEnded, descReleased, descRefused, descLoadsMiss, descAutoSteps, descRequests, descEventsPub, descEventsDrp, descEventsSent, descBatchesDrp,
		descPrefetches, descPrefPromos, descPrefQueued, descPrefFlight, descPrefYield, descPins, descPinned, descDeleted,
		descTenantHeld, descTenantQuota, descTenantEvict, descTenantLook, descTenantStore, descTenantRefsd, descTenantTier, descTenantTierQ,
	} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	gauge(descConns, float64(c.s.sessions.count()))
	counter(descSideRefsd, c.s.sideRefused.Load())
	counter(descSessEnded, c.s.sessions.ended.Load())
	for _, ns := range c.s.allNamespaces() {
		st, err := ns.Stats()
		if err != nil {
			continue // shutting down
		}
		n := ns.name
		p := st.Primary
		gauge(descPrimarySlots, float64(p.NumSlots), n, "total")
		gauge(descPrimarySlots, float64(p.UsedSlots), n, "used")
		gauge(descPrimarySlots, float64(p.PendingSlots), n, "pending")
		gauge(descPrimarySlots, float64(p.PinnedSlots), n, "pinned")
		gauge(descPrimarySlots, float64(p.RevocableSlots), n, "revocable")
		gauge(descPrimarySlots, float64(p.LeasedSlots), n, "leased")
		gauge(descPrimarySlot, float64(p.SlotSize), n)
		counter(descPrimaryLook, p.Hits, n, "hit")
		counter(descPrimaryLook, p.Misses, n, "miss")
		counter(descPrimaryEvict, p.Evictions, n)
		counter(descPrimaryRej, p.StoresRejected, n)
		gauge(descRequests, float64(st.ActiveRequests), n)
		gauge(descCascadePin, float64(st.CascadePinned), n)
		gauge(descCascadeBud, float64(st.CascadeBudget), n)
		gauge(descCascadeDef, float64(st.DeferredBlocks), n)
		counter(descRevoked, st.Revocations, n)
		gauge(descSessions, float64(st.Sessions), n)
		counter(descReleased, st.ReleasedRequests, n, "session_ended")
		counter(descReleased, st.ExpiredRequests, n, "idle")
		counter(descRefused, st.RefusedFull, n, "full")
		counter(descRefused, st.RefusedSession, n, "session_cap")
		counter(descLoadsMiss, st.LoadsMissing, n)
		counter(descAutoSteps, st.AutoSteps, n)
		counter(descEventsPub, st.EventsPublished, n)
		counter(descEventsDrp, st.EventsDropped, n)
		counter(descEventsSent, st.SinkEventsPublished, n)
		counter(descBatchesDrp, st.SinkBatchesDropped, n)
		pf := st.Prefetch
		counter(descPrefetches, pf.Started, n, "started")
		counter(descPrefetches, pf.Completed, n, "completed")
		counter(descPrefetches, pf.Expired, n, "expired")
		counter(descPrefetches, pf.Refused, n, "refused")
		counter(descPrefPromos, pf.Promotions, n)
		gauge(descPrefQueued, float64(pf.Queued), n)
		gauge(descPrefFlight, float64(pf.InFlight), n)
		counter(descPrefYield, pf.Yielded, n)
		pn := st.Pins
		counter(descPins, pn.Pinned, n, "pinned")
		counter(descPins, pn.Unpinned, n, "unpinned")
		counter(descPins, pn.Expired, n, "expired")
		counter(descPins, pn.Refused, n, "refused")
		gauge(descPinned, float64(pn.Blocks), n)
		for tier, v := range st.Deleted {
			counter(descDeleted, v, n, tier)
		}
		collectTiers(ch, n, st.Tiers)
		for _, t := range st.Tiers {
			for _, sh := range t.Shares {
				if name := c.s.tenancy.spaceName(sh.Space); name != "" {
					gauge(descTenantTier, float64(sh.Bytes), n, t.Name, name)
					gauge(descTenantTierQ, float64(sh.Quota), n, t.Name, name)
				}
			}
		}
		for _, ts := range c.s.tenancy.stats(st) {
			if len(st.Shares) == 0 {
				break // a namespace whose primary has no shares (an engine's)
			}
			gauge(descTenantHeld, float64(ts.GetPrimaryBytes()), n, ts.GetName())
			gauge(descTenantQuota, float64(ts.GetPrimaryQuotaBytes()), n, ts.GetName())
			counter(descTenantEvict, ts.GetEvicted()-ts.GetEvictedByOthers(), n, ts.GetName(), "self")
			counter(descTenantEvict, ts.GetEvictedByOthers(), n, ts.GetName(), "others")
		}
	}
	for _, t := range c.s.tenancy.tenants {
		counter(descTenantLook, t.ctr.hits.Load(), t.name, "hit")
		counter(descTenantLook, t.ctr.misses.Load(), t.name, "miss")
		counter(descTenantStore, t.ctr.stored.Load(), t.name)
		counter(descTenantRefsd, t.ctr.refusals.Load(), t.name)
	}
	// Tier mode: the namespaces of the engines' regions have no primary
	// here (vLLM's CPU cache is theirs), but their tiers are the daemon's.
	if c.s.regions != nil {
		for _, rs := range c.s.regions.Stats(context.Background()) {
			gauge(descRequests, float64(rs.Requests), rs.Name)
			gauge(descSessions, float64(rs.Regions), rs.Name)
			counter(descRegionLook, rs.LookupKeys[region.Hit], rs.Name, "hit")
			counter(descRegionLook, rs.LookupKeys[region.Miss], rs.Name, "miss")
			counter(descRegionLook, rs.LookupKeys[region.Unknown], rs.Name, "unknown")
			ch <- promotionSteps(rs)
			collectTiers(ch, rs.Name, tierStatsOf(rs.Tiers, rs.TierObjects, int64(rs.RowStride)))
		}
	}
}

// promotionSteps is the histogram of a tier-mode namespace's promotions
// in engine steps.
func promotionSteps(rs region.NamespaceStats) prometheus.Metric {
	buckets := make(map[float64]uint64, len(region.PromotionStepBuckets))
	var n uint64
	for i, le := range region.PromotionStepBuckets {
		if i < len(rs.PromotionSteps) {
			n += rs.PromotionSteps[i]
		}
		buckets[float64(le)] = n
	}
	for _, c := range rs.PromotionSteps[min(len(region.PromotionStepBuckets), len(rs.PromotionSteps)):] {
		n += c
	}
	return prometheus.MustNewConstHistogram(descRegionPromo, n, float64(rs.PromotionStepSum), buckets, rs.Name)
}

// collectTiers sends the series of namespace n's secondary tiers.
func collectTiers(ch chan<- prometheus.Metric, n string, tiers []TierStats) {
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	for _, t := range tiers {
		d := explain.Declaration{Name: t.Name, Type: t.Type, Medium: t.Medium, Locality: t.Locality}
		l := []string{n, t.Name, t.Type, d.MediumString(), d.LocalityString()}
		with := func(extra string) []string { return append(append([]string(nil), l...), extra) }
		counter(descTierLookups, t.Hits, with("hit")...)
		counter(descTierLookups, t.Misses, with("miss")...)
		counter(descTierLookups, t.Retries, with("retry")...)
		counter(descTierSkipped, t.SkippedByFilter, l...)
		counter(descTierPromos, t.PromotionsOK, with("ok")...)
		counter(descTierPromos, t.PromotionsFailed, with("failed")...)
		counter(descTierCascades, t.CascadesOK, with("ok")...)
		counter(descTierCascades, t.CascadesFailed, with("failed")...)
		counter(descTierCascades, t.CascadesDropped, with("dropped")...)
		counter(descTierCascades, t.CascadesFiltered, with("filtered")...)
		for r, v := range t.DroppedBy {
			counter(descTierDropped, v, with(tiering.DropReason(r).String())...)
		}
		counter(descTierDeferred, t.CascadesDeferred, l...)
		counter(descTierRevoked, t.CascadeBlocksRevoked, l...)
		gauge(descTierPinned, float64(t.PinnedSlots), l...)
		gauge(descTierPinBudget, float64(t.PinBudget), l...)
		gauge(descTierQueued, float64(t.Queued), l...)
		gauge(descTierQueueCap, float64(t.QueueCapacity), l...)
		counter(descTierBytes, t.BytesIn, with("in")...)
		counter(descTierBytes, t.BytesOut, with("out")...)
		pressure := 0.0
		if t.UnderPressure {
			pressure = 1
		}
		gauge(descTierPressure, pressure, l...)
		if t.OccupancyBlocks >= 0 {
			gauge(descTierBlocks, float64(t.OccupancyBlocks), l...)
		}
		if t.OccupancyBytes >= 0 {
			gauge(descTierHeld, float64(t.OccupancyBytes), l...)
		}
		counter(descTierEvictions, t.Evictions, l...)
		counter(descTierCorrupt, t.CorruptBlocks, l...)
		counter(descTierCorrDel, t.CorruptDeleted, l...)
		healthy := 1.0
		if r := t.Remote; r != nil {
			if !r.Healthy {
				healthy = 0
			}
			counter(descTierLookDown, r.LookupsUnhealthy, l...)
			counter(descTierJobsSkip, r.LoadJobsSkipped, with("load")...)
			counter(descTierJobsSkip, r.StoreJobsSkipped, with("store")...)
			counter(descTierReconRm, r.ReconciledRemovals, l...)
			counter(descTierReconErr, r.ReconcileFailures, l...)
			counter(descStoresFull, r.StoresFull, l...)
			if t.Type == "redis" {
				counter(descNodeDown, r.NodeDownBlocks, l...)
				counter(descSlotMap, r.SlotMapChanges, l...)
			}
			for _, nd := range r.Nodes {
				v := 0.0
				if nd.Healthy {
					v = 1
				}
				gauge(descTierNode, v, with(nd.Addr)...)
				if ix := nd.Index; ix != nil {
					v = 0
					if ix.Current {
						v = 1
					}
					gauge(descNodeIndexed, v, with(nd.Addr)...)
					gauge(descNodeIndexKeys, float64(ix.Blocks), with(nd.Addr)...)
					counter(descNodeIndexGaps, uint64(ix.Gaps), with(nd.Addr)...)
				}
			}
		}
		gauge(descTierHealthy, healthy, l...)
		for kind, h := range map[string]*Histogram{"load": t.LoadLatency, "store": t.StoreLatency} {
			if h == nil || len(h.Bounds) != len(h.Counts) {
				continue
			}
			buckets := make(map[float64]uint64, len(h.Bounds))
			for i, b := range h.Bounds {
				buckets[b] = h.Counts[i]
			}
			ch <- prometheus.MustNewConstHistogram(descTierJobs, h.Count, h.Sum, buckets, with(kind)...)
		}
	}
}
