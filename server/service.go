package server

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/zeebo/xxh3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	kvtierv1 "github.com/kvtier/kvtier/api/kvtier/v1"
	"github.com/kvtier/kvtier/explain"
	"github.com/kvtier/kvtier/keyspace"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/tiering"
)

// service implements kvtierv1.KVTierServer on top of the namespaces.
type service struct {
	kvtierv1.UnimplementedKVTierServer
	s *Server
}

// open returns the namespace a call names and the scope of its keys and
// request identifiers; a tenant naming a namespace that is not its own is
// refused before the name is looked up, so that a refusal says nothing of
// what exists.
func (sv *service) open(ctx context.Context, name string) (*Namespace, scope, error) {
	p := principalOf(ctx)
	nsName, sc, err := sv.s.tenancy.resolve(p, name)
	if err != nil {
		return nil, sc, toStatus(err)
	}
	ns, err := sv.ns(nsName)
	if err != nil {
		return nil, sc, toStatus(err)
	}
	return ns, sc, nil
}

// openAdmin is open for the admin's calls (the interceptor already keeps
// tenants away from them; this keeps a handler from ever serving one).
func (sv *service) openAdmin(ctx context.Context, name string) (*Namespace, scope, error) {
	if t := principalOf(ctx).t; t != nil {
		return nil, scope{}, status.Errorf(codes.PermissionDenied, "tenant %q: the call is the admin's", t.name)
	}
	return sv.open(ctx, name)
}

// openEngine is open for manager mode's calls (the engine calls,
// GetArena): the admin's anywhere, a tenant's only on an engine namespace
// its own engines created, whose arena holds nothing of anyone else's.
func (sv *service) openEngine(ctx context.Context, name string) (*Namespace, scope, error) {
	if t := principalOf(ctx).t; t != nil && sv.s.tenancy.ownerOf(name) != t {
		t.ctr.refusals.Add(1)
		return nil, scope{}, status.Errorf(codes.PermissionDenied, "tenant %q: namespace %q is not one its engines attached (a tenant's engine calls and arena are its own engine namespaces': EngineAttach names them)", t.name, name)
	}
	return sv.open(ctx, name)
}

func (sv *service) ns(name string) (*Namespace, error) {
	ns, ok := sv.s.Namespace(name)
	if !ok {
		names := sv.allNames()
		switch {
		case len(names) == 0:
			return nil, fmt.Errorf("%w: the daemon has no namespace yet (primary.bytes is 0: namespaces appear as engines attach in manager mode or register regions in tier mode)", ErrUnknownNamespace)
		case name == "":
			return nil, fmt.Errorf("%w: no default namespace; name one of %v", ErrUnknownNamespace, names)
		}
		return nil, fmt.Errorf("%w %q (have %v)", ErrUnknownNamespace, name, names)
	}
	return ns, nil
}

// allNames lists, quoted and sorted, the daemon's namespaces: its own,
// the engines' and those of tier mode's regions.
func (sv *service) allNames() []string {
	names := sv.s.namespaceNames()
	if sv.s.regions != nil {
		for _, rs := range sv.s.regions.Stats(context.Background()) {
			if q := fmt.Sprintf("%q", rs.Name); !slices.Contains(names, q) {
				names = append(names, q)
			}
		}
		slices.Sort(names)
	}
	return names
}

func (sv *service) NewRequest(ctx context.Context, in *kvtierv1.NewRequestRequest) (*kvtierv1.NewRequestResponse, error) {
	ns, sc, err := sv.open(ctx, in.GetNamespace())
	if err != nil {
		return nil, err
	}
	owner := ""
	if sc.t != nil {
		owner = sc.t.name
	}
	rc, policy, err := ns.NewRequest(sessionOf(ctx), owner, sc.req(in.GetRequestId()), []byte(in.GetKvTransferParams()))
	if err != nil {
		return nil, toStatus(err)
	}
	return &kvtierv1.NewRequestResponse{
		Policy:           kvtierv1.OffloadPolicy(policy),
		LoadFilter:       filterProto(rc.LoadFilter),
		StoreFilter:      filterProto(rc.StoreFilter),
		LoadFromRequest:  rc.LoadFromRequest,
		StoreFromRequest: rc.StoreFromRequest,
		Warnings:         warningsProto(rc.Warnings),
	}, nil
}

func (sv *service) Lookup(ctx context.Context, in *kvtierv1.LookupRequest) (*kvtierv1.LookupResponse, error) {
	ns, sc, keys, err := sv.nsKeys(ctx, in, false)
	if err != nil {
		return nil, err
	}
	res := make([]offload.LookupResult, len(keys))
	hits, err := ns.Lookup(sessionOf(ctx), sc.req(in.GetRequestId()), keys, in.GetPrefixScan(), res)
	if err != nil {
		return nil, sc.refused(err)
	}
	sc.countLookups(res)
	out := &kvtierv1.LookupResponse{Results: resultsProto(res), Hits: uint32(hits)}
	if in.GetWantSources() {
		if out.Sources, err = ns.Sources(keys); err != nil {
			return nil, toStatus(err)
		}
	}
	return out, nil
}

// keyed is a request carrying keys in either form.
type keyed interface {
	GetNamespace() string
	GetKeys() [][]byte
	GetPackedKeys() []byte
	GetKeySize() uint32
}

// nsKeys opens the namespace of a keyed call (admin: the admin's call)
// and returns its keys in the call's key space.
func (sv *service) nsKeys(ctx context.Context, in keyed, admin bool) (*Namespace, scope, []offload.Key, error) {
	open := sv.open
	if admin {
		open = sv.openAdmin
	}
	ns, sc, err := open(ctx, in.GetNamespace())
	if err != nil {
		return nil, sc, nil, err
	}
	keys, err := ns.limits.keysOf(in, sc.keys)
	if err != nil {
		return nil, sc, nil, toStatus(err)
	}
	return ns, sc, keys, nil
}

// keysOf returns a call's keys (keys or packed_keys) in space sp.
func (l Limits) keysOf(in keyed, sp keyspace.Space) ([]offload.Key, error) {
	switch {
	case len(in.GetPackedKeys()) > 0 && len(in.GetKeys()) > 0:
		return nil, fmt.Errorf("%w: both keys and packed_keys set", ErrInvalidArgument)
	case len(in.GetPackedKeys()) > 0:
		return l.packedKeys(in.GetPackedKeys(), int(in.GetKeySize()), sp)
	default:
		return l.keys(in.GetKeys(), sp)
	}
}

func (sv *service) PrepareLoad(ctx context.Context, in *kvtierv1.PrepareLoadRequest) (*kvtierv1.PrepareLoadResponse, error) {
	ns, sc, keys, err := sv.nsKeys(ctx, in, true)
	if err != nil {
		return nil, err
	}
	slots, missing, err := ns.PrepareLoad(sessionOf(ctx), sc.req(in.GetRequestId()), keys, in.GetAllowMissing())
	if err != nil {
		return nil, toStatus(err)
	}
	return &kvtierv1.PrepareLoadResponse{Slots: slots, Missing: uint32(missing)}, nil
}

func (sv *service) CompleteLoad(ctx context.Context, in *kvtierv1.CompleteLoadRequest) (*kvtierv1.CompleteLoadResponse, error) {
	ns, sc, keys, err := sv.nsKeys(ctx, in, true)
	if err != nil {
		return nil, err
	}
	if err := ns.CompleteLoad(sessionOf(ctx), sc.req(in.GetRequestId()), keys); err != nil {
		return nil, toStatus(err)
	}
	return &kvtierv1.CompleteLoadResponse{}, nil
}

func (sv *service) Touch(ctx context.Context, in *kvtierv1.TouchRequest) (*kvtierv1.TouchResponse, error) {
	ns, sc, keys, err := sv.nsKeys(ctx, in, false)
	if err != nil {
		return nil, err
	}
	if err := ns.Touch(sessionOf(ctx), sc.req(in.GetRequestId()), keys); err != nil {
		return nil, toStatus(err)
	}
	return &kvtierv1.TouchResponse{}, nil
}

func (sv *service) PrepareStore(ctx context.Context, in *kvtierv1.PrepareStoreRequest) (*kvtierv1.PrepareStoreResponse, error) {
	ns, sc, keys, err := sv.nsKeys(ctx, in, true)
	if err != nil {
		return nil, err
	}
	var metas []BlockMeta
	if len(in.GetMetadata()) > 0 {
		metas = make([]BlockMeta, len(in.GetMetadata()))
		for i, m := range in.GetMetadata() {
			metas[i] = metaFromProto(m)
		}
	}
	out, ok, err := ns.PrepareStore(sessionOf(ctx), sc.req(in.GetRequestId()), keys, metas)
	if err != nil {
		return nil, toStatus(err)
	}
	return &kvtierv1.PrepareStoreResponse{
		Ok:          ok,
		KeysToStore: sc.keysProto(out.KeysToStore),
		Slots:       out.Slots,
		Evicted:     sc.keysProto(out.Evicted),
	}, nil
}

func (sv *service) CompleteStore(ctx context.Context, in *kvtierv1.CompleteStoreRequest) (*kvtierv1.CompleteStoreResponse, error) {
	ns, sc, keys, err := sv.nsKeys(ctx, in, true)
	if err != nil {
		return nil, err
	}
	if err := ns.CompleteStore(sessionOf(ctx), sc.req(in.GetRequestId()), keys, in.GetSuccess()); err != nil {
		return nil, toStatus(err)
	}
	return &kvtierv1.CompleteStoreResponse{}, nil
}

func (sv *service) FinishRequest(ctx context.Context, in *kvtierv1.FinishRequestRequest) (*kvtierv1.FinishRequestResponse, error) {
	ns, sc, err := sv.open(ctx, in.GetNamespace())
	if err != nil {
		return nil, err
	}
	if err := ns.FinishRequest(sessionOf(ctx), sc.req(in.GetRequestId())); err != nil {
		return nil, toStatus(err)
	}
	return &kvtierv1.FinishRequestResponse{}, nil
}

func (sv *service) ScheduleEnd(ctx context.Context, in *kvtierv1.ScheduleEndRequest) (*kvtierv1.ScheduleEndResponse, error) {
	ns, sc, err := sv.open(ctx, in.GetNamespace())
	if err != nil {
		return nil, err
	}
	pending, n, err := ns.ScheduleEnd(offload.ScheduleEnd{NewReqIDs: sc.reqIDs(in.GetNewRequestIds()), PreemptedReqIDs: sc.reqIDs(in.GetPreemptedRequestIds())})
	if err != nil {
		return nil, toStatus(err)
	}
	return &kvtierv1.ScheduleEndResponse{HasPendingWork: pending, EventsPublished: uint32(n)}, nil
}

func (sv *service) Reset(ctx context.Context, in *kvtierv1.ResetRequest) (*kvtierv1.ResetResponse, error) {
	ns, _, err := sv.openAdmin(ctx, in.GetNamespace())
	if err != nil {
		return nil, err
	}
	if err := ns.Reset(ctx); err != nil {
		return nil, toStatus(err)
	}
	return &kvtierv1.ResetResponse{}, nil
}

func (sv *service) Stats(ctx context.Context, in *kvtierv1.StatsRequest) (*kvtierv1.StatsResponse, error) {
	name := in.GetNamespace()
	if p := principalOf(ctx); p.t != nil || sv.s.tenancy.shared[name] != nil {
		return sv.tenantStats(ctx, p, name)
	}
	name = sv.soleNamespace(name)
	ns, err := sv.ns(name)
	if err != nil {
		if st, ok := sv.regionStats(ctx, name); ok {
			return statsProto(st), nil
		}
		return nil, toStatus(err)
	}
	st, err := ns.Stats()
	if err != nil {
		return nil, toStatus(err)
	}
	out := statsProto(st)
	out.StreamAddr = sv.s.StreamAddr()
	out.Tenants = sv.s.tenancy.stats(st)
	return out, nil
}

// soleNamespace resolves "" on a daemon without a default namespace to
// its only namespace (one engine layout, or one tier-mode layout), so
// that operators and routers need not learn a generated name; any other
// name is returned as it is.
func (sv *service) soleNamespace(name string) string {
	if _, ok := sv.s.Namespace(name); !ok && name == "" {
		if names := sv.allNames(); len(names) == 1 {
			name, _ = strconv.Unquote(names[0])
		}
	}
	return name
}

func (sv *service) Explain(ctx context.Context, in *kvtierv1.ExplainRequest) (*kvtierv1.ExplainResponse, error) {
	ns, _, err := sv.open(ctx, in.GetNamespace())
	if err != nil {
		return nil, err
	}
	ex, err := ns.Explain([]byte(in.GetKvTransferParams()))
	if err != nil {
		return nil, toStatus(err)
	}
	resp := &kvtierv1.ExplainResponse{
		LoadFilter:       filterProto(ex.Load.Filter),
		StoreFilter:      filterProto(ex.Store.Filter),
		LoadFromRequest:  ex.Load.FromRequest,
		StoreFromRequest: ex.Store.FromRequest,
		Warnings:         warningsProto(ex.Warnings),
		StrictError:      ex.StrictError,
		ValidationMode:   ex.Mode.String(),
	}
	for _, v := range ex.Tiers {
		resp.Tiers = append(resp.Tiers, &kvtierv1.TierDecision{
			Name: v.Name, Type: v.Type,
			Medium: kvtierv1.Medium(v.Medium), Locality: kvtierv1.Locality(v.Locality),
			Load: v.Load.Allowed, LoadReason: reason(v.Load, ex.Load),
			Store: v.Store.Allowed, StoreReason: reason(v.Store, ex.Store),
		})
	}
	return resp, nil
}

// reason is a tier's verdict for one direction with where the filter
// came from (the response has no field of its own for that).
func reason(v explain.Verdict, s explain.Side) string {
	return v.Reason + " (" + s.Source() + ")"
}

func (sv *service) PutBlocks(ctx context.Context, in *kvtierv1.PutBlocksRequest) (*kvtierv1.PutBlocksResponse, error) {
	ns, sc, err := sv.open(ctx, in.GetNamespace())
	if err != nil {
		return nil, err
	}
	blocks := in.GetBlocks()
	raw := make([][]byte, len(blocks))
	data := make([][]byte, len(blocks))
	var metas []BlockMeta
	for i, b := range blocks {
		raw[i], data[i] = b.GetKey(), b.GetData()
		if m := b.GetMetadata(); m != nil {
			if metas == nil {
				metas = make([]BlockMeta, len(blocks))
			}
			metas[i] = metaFromProto(m)
		}
	}
	keys, err := ns.Keys(raw, sc.keys)
	if err != nil {
		return nil, toStatus(err)
	}
	written, evicted, err := ns.PutBlocks(sessionOf(ctx), sc.req(in.GetRequestId()), []byte(in.GetKvTransferParams()), keys, data, metas)
	if err != nil {
		return nil, sc.refused(err)
	}
	sc.countStored(written)
	st := make([]kvtierv1.PutStatus, len(written))
	for i, w := range written {
		st[i] = kvtierv1.PutStatus_PUT_STATUS_ALREADY_PRESENT
		if w {
			st[i] = kvtierv1.PutStatus_PUT_STATUS_STORED
		}
	}
	return &kvtierv1.PutBlocksResponse{Statuses: st, Evicted: sc.keysProto(evicted)}, nil
}

func (sv *service) GetBlocks(ctx context.Context, in *kvtierv1.GetBlocksRequest) (*kvtierv1.GetBlocksResponse, error) {
	ns, sc, err := sv.open(ctx, in.GetNamespace())
	if err != nil {
		return nil, err
	}
	keys, err := ns.Keys(in.GetKeys(), sc.keys)
	if err != nil {
		return nil, toStatus(err)
	}
	wait := time.Duration(in.GetWaitMs()) * time.Millisecond
	res, data, hits, err := ns.GetBlocks(ctx, sessionOf(ctx), sc.req(in.GetRequestId()), []byte(in.GetKvTransferParams()), keys, wait, in.GetPrefixOnly())
	if err != nil {
		return nil, sc.refused(err)
	}
	sc.countLookups(res)
	blocks := make([]*kvtierv1.Block, len(keys))
	var sums []uint64
	if in.GetWantChecksums() {
		sums = make([]uint64, len(keys))
	}
	for i := range keys {
		blocks[i] = &kvtierv1.Block{Key: in.GetKeys()[i], Data: data[i]}
		if sums != nil && data[i] != nil {
			sums[i] = xxh3.Hash(data[i])
		}
	}
	return &kvtierv1.GetBlocksResponse{Blocks: blocks, Results: resultsProto(res), Hits: uint32(hits), Checksums: sums}, nil
}

func (sv *service) GetArena(ctx context.Context, in *kvtierv1.GetArenaRequest) (*kvtierv1.GetArenaResponse, error) {
	ns, _, err := sv.openEngine(ctx, in.GetNamespace())
	if err != nil {
		return nil, err
	}
	a := ns.Arena()
	resp := &kvtierv1.GetArenaResponse{
		SlotSize: int64(a.SlotSize),
		NumSlots: int64(a.NumSlots),
		Size:     int64(a.SlotSize) * int64(a.NumSlots),
	}
	switch a.Kind {
	case "file":
		resp.Kind = kvtierv1.ArenaKind_ARENA_KIND_FILE
		resp.Path = a.Path
	case "memfd":
		resp.Kind = kvtierv1.ArenaKind_ARENA_KIND_MEMFD
	default:
		resp.Kind = kvtierv1.ArenaKind_ARENA_KIND_ANONYMOUS
		return resp, nil
	}
	if a.file != nil {
		resp.FdSocket = sv.s.fdSocketPath()
		if resp.Ticket, err = sv.s.arenaTicket(ns.name); err != nil {
			return nil, toStatus(err)
		}
	}
	return resp, nil
}

func keysProto(keys []offload.Key) [][]byte {
	if len(keys) == 0 {
		return nil
	}
	out := make([][]byte, len(keys))
	for i, k := range keys {
		out[i] = []byte(k)
	}
	return out
}

func resultsProto(res []offload.LookupResult) []kvtierv1.LookupResult {
	out := make([]kvtierv1.LookupResult, len(res))
	for i, r := range res {
		out[i] = resultProto(r)
	}
	return out
}

func resultProto(r offload.LookupResult) kvtierv1.LookupResult {
	switch r {
	case offload.Miss:
		return kvtierv1.LookupResult_LOOKUP_RESULT_MISS
	case offload.Hit:
		return kvtierv1.LookupResult_LOOKUP_RESULT_HIT
	case offload.HitPending:
		return kvtierv1.LookupResult_LOOKUP_RESULT_HIT_PENDING
	case offload.Retry:
		return kvtierv1.LookupResult_LOOKUP_RESULT_RETRY
	}
	return kvtierv1.LookupResult_LOOKUP_RESULT_UNSPECIFIED
}

func filterProto(f *offload.TierFilter) *kvtierv1.TierFilter {
	out := &kvtierv1.TierFilter{All: f.IsAll(), Text: f.String()}
	for _, m := range f.Matchers() {
		out.Matchers = append(out.Matchers, &kvtierv1.TierMatcher{Medium: kvtierv1.Medium(m.Medium), Locality: kvtierv1.Locality(m.Locality)})
	}
	return out
}

func warningsProto(ws []offload.Warning) []*kvtierv1.FilterWarning {
	if len(ws) == 0 {
		return nil
	}
	out := make([]*kvtierv1.FilterWarning, len(ws))
	for i, w := range ws {
		out[i] = &kvtierv1.FilterWarning{Field: w.Field, Reason: w.Reason, Entry: int32(w.Entry), Value: w.Value, Message: w.Message}
	}
	return out
}

func metaFromProto(m *kvtierv1.BlockMetadata) BlockMeta {
	bm := BlockMeta{
		BlockHashes: m.GetBlockHashes(),
		ParentHash:  m.GetParentBlockHash(),
		TokenIDs:    m.GetTokenIds(),
		BlockSize:   int(m.GetBlockSize()),
		SpecKind:    m.GetKvCacheSpecKind(),
	}
	if m.LoraId != nil {
		v := m.GetLoraId()
		bm.LoraID = &v
	}
	if m.LoraName != nil {
		v := m.GetLoraName()
		bm.LoraName = &v
	}
	if m.KvCacheSpecSlidingWindow != nil {
		v := m.GetKvCacheSpecSlidingWindow()
		bm.SlidingWindow = &v
	}
	return bm
}

func statsProto(st Stats) *kvtierv1.StatsResponse {
	p := st.Primary
	resp := &kvtierv1.StatsResponse{
		Namespace: st.Namespace,
		Primary: &kvtierv1.PrimaryStats{
			SlotSize: p.SlotSize, NumSlots: p.NumSlots,
			UsedSlots: p.UsedSlots, PendingSlots: p.PendingSlots, PinnedSlots: p.PinnedSlots,
			Lookups: p.Lookups, Hits: p.Hits, Misses: p.Misses, Evictions: p.Evictions,
			StoresRejected: p.StoresRejected, RevocableSlots: p.RevocableSlots, LeasedSlots: p.LeasedSlots,
		},
		ActiveRequests:     int64(st.ActiveRequests),
		CascadePinnedSlots: st.CascadePinned,
		CascadePinBudget:   st.CascadeBudget,
		CascadeRevocations: st.Revocations,
		Sessions:           int64(st.Sessions),
		ExpiredRequests:    st.ExpiredRequests,
		ReleasedRequests:   st.ReleasedRequests,
		AutoSteps:          st.AutoSteps,
		RouterPinnedBlocks: int64(st.Pins.Blocks),
	}
	for _, t := range st.Tiers {
		dropped := make(map[string]uint64, len(t.DroppedBy))
		for r, v := range t.DroppedBy {
			dropped[tiering.DropReason(r).String()] = v
		}
		healthy := t.Remote == nil || t.Remote.Healthy
		resp.Tiers = append(resp.Tiers, &kvtierv1.TierStats{
			Name: t.Name, Type: t.Type,
			Medium: kvtierv1.Medium(t.Medium), Locality: kvtierv1.Locality(t.Locality),
			Hits: t.Hits, Misses: t.Misses, Retries: t.Retries, SkippedByFilter: t.SkippedByFilter,
			PromotionsOk: t.PromotionsOK, PromotionsFailed: t.PromotionsFailed,
			CascadesOk: t.CascadesOK, CascadesFailed: t.CascadesFailed,
			CascadesDropped: t.CascadesDropped, CascadesFiltered: t.CascadesFiltered,
			BytesIn: t.BytesIn, BytesOut: t.BytesOut, UnderPressure: t.UnderPressure,
			CascadesDroppedByReason: dropped,
			CascadeBlocksRevoked:    t.CascadeBlocksRevoked,
			CascadePinnedSlots:      t.PinnedSlots, CascadePinBudget: t.PinBudget,
			QueuedJobs: t.Queued, QueueCapacity: t.QueueCapacity,
			CascadeLatencyEmaSeconds: t.CascadeLatencyEMA.Seconds(),
			Healthy:                  healthy,
			Blocks:                   t.OccupancyBlocks, Bytes: t.OccupancyBytes, Evictions: t.Evictions,
			CorruptBlocks: t.CorruptBlocks,
		})
	}
	return resp
}
