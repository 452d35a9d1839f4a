package server

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	kvtierv1 "github.com/kvtier/kvtier/api/kvtier/v1"
	"github.com/kvtier/kvtier/keyspace"
	"github.com/kvtier/kvtier/offload"
)

// Tenancy. A call is made by the admin or by one tenant, told apart by
// its bearer token (authenticate). The admin is the holder of
// Config.AuthToken. A caller without a token is the admin only when the
// daemon has no token at all; otherwise, on the Unix socket, it is whom
// Config.UnixPeers names for its user id (unixpeer.go), and on TCP no one.
//
// A tenant reaches only the namespaces its configuration lists and the
// shared spaces it belongs to; every other namespace answers
// PERMISSION_DENIED, whether it exists or not. It may call only the
// copying API (tenantMethods) and manager mode on engine namespaces of
// its own: the slot protocol (PrepareStore, PrepareLoad and their
// completions) names arena slots, which in a namespace tenants share hold
// every tenant's bytes, so it is the admin's, as are Reset, ListBlocks,
// the region calls, and GetArena and the engine calls anywhere but in an
// engine namespace the tenant's own engines created. Such a namespace
// (layout name + "~" + tenant) has a primary and an arena of its own, and
// its keys are put in the tenant's key space like every other call's. Its keys and request identifiers are scoped to
// its key space before the namespace sees them (scope), and keys go back
// to it stripped of their tag, only its own.

// TenantConfig is one tenant.
type TenantConfig struct {
	Name  string
	Token string
	// Namespaces are the API names of the namespaces the token reaches
	// ("" is the default namespace).
	Namespaces []string
	// ClientCertCN, if set, binds the tenant to verified TLS client
	// certificates of this common name: such a caller is the tenant
	// without a token, and the tenant's token from a caller presenting
	// another certificate is refused.
	ClientCertCN string
}

// SharedSpaceConfig is a key space several tenants share, reached as the
// API namespace Name that stores into the namespace Namespace.
type SharedSpaceConfig struct {
	Name      string
	Namespace string
	Tenants   []string
}

// tenantMethods are the calls a tenant may make; every other is the
// admin's.
var tenantMethods = map[string]bool{
	kvtierv1.KVTier_NewRequest_FullMethodName:    true,
	kvtierv1.KVTier_Lookup_FullMethodName:        true,
	kvtierv1.KVTier_Residency_FullMethodName:     true,
	kvtierv1.KVTier_Prefetch_FullMethodName:      true,
	kvtierv1.KVTier_Pin_FullMethodName:           true,
	kvtierv1.KVTier_Unpin_FullMethodName:         true,
	kvtierv1.KVTier_Delete_FullMethodName:        true,
	kvtierv1.KVTier_Touch_FullMethodName:         true,
	kvtierv1.KVTier_FinishRequest_FullMethodName: true,
	kvtierv1.KVTier_ScheduleEnd_FullMethodName:   true,
	kvtierv1.KVTier_Stats_FullMethodName:         true,
	kvtierv1.KVTier_Explain_FullMethodName:       true,
	kvtierv1.KVTier_PutBlocks_FullMethodName:     true,
	kvtierv1.KVTier_GetBlocks_FullMethodName:     true,
	// Manager mode, on engine namespaces of the tenant's own only
	// (service.openEngine): their arenas hold its blocks alone.
	kvtierv1.KVTier_EngineAttach_FullMethodName:  true,
	kvtierv1.KVTier_EngineStep_FullMethodName:    true,
	kvtierv1.KVTier_EngineReserve_FullMethodName: true,
	kvtierv1.KVTier_GetArena_FullMethodName:      true,
	// Tier mode, on regions the tenant drives (region.go).
	kvtierv1.KVTier_RegionLookup_FullMethodName:  true,
	kvtierv1.KVTier_RegionLookups_FullMethodName: true,
	kvtierv1.KVTier_RegionSubmit_FullMethodName:  true,
	kvtierv1.KVTier_RegionStep_FullMethodName:    true,
	kvtierv1.KVTier_RegionDrain_FullMethodName:   true,
}

// tenantStreams are the streaming calls a tenant may make.
var tenantStreams = map[string]bool{
	kvtierv1.KVTier_RegionResults_FullMethodName: true,
}

// tenant is a configured tenant and its counters.
type tenant struct {
	name       string
	certCN     string
	index      int // in tenancy.tenants
	space      keyspace.Space
	namespaces map[string]bool
	ctr        tenantCounters
}

// tenantCounters are a tenant's cumulative counters (metrics, Stats).
type tenantCounters struct {
	hits, misses atomic.Uint64 // blocks looked up or read
	stored       atomic.Uint64 // blocks PutBlocks or the stream wrote
	refusals     atomic.Uint64 // calls refused: permission, limits, a full primary
}

// sharedSpace is a configured shared space.
type sharedSpace struct {
	name    string
	ns      string // the namespace it stores into
	space   keyspace.Space
	tenants map[string]bool
}

// tenancy is the server's principals.
type tenancy struct {
	admin   string
	tenants []*tenant
	byToken map[[32]byte]*tenant
	byCert  map[string]*tenant // ClientCertCN
	shared  map[string]*sharedSpace
	// unixPeers: who a token-less caller on the Unix socket is, by uid.
	unixPeers map[int]principal
	// owned are the engine namespaces tenants' engines created
	// (engine.go), each with an arena of its own: only its tenant (and
	// the admin) reaches them.
	ownedMu sync.RWMutex
	owned   map[string]*tenant
}

// byName returns the tenant called name (nil: none).
func (tn *tenancy) byName(name string) *tenant {
	for _, t := range tn.tenants {
		if t.name == name {
			return t
		}
	}
	return nil
}

// ownerOf returns the tenant whose engines own namespace name (nil: none).
func (tn *tenancy) ownerOf(name string) *tenant {
	tn.ownedMu.RLock()
	defer tn.ownedMu.RUnlock()
	return tn.owned[name]
}

// own records that tenant t's engines created namespace name.
func (tn *tenancy) own(name string, t *tenant) {
	tn.ownedMu.Lock()
	defer tn.ownedMu.Unlock()
	if tn.owned == nil {
		tn.owned = map[string]*tenant{}
	}
	tn.owned[name] = t
}

// ownedBy counts the namespaces tenant t's engines created.
func (tn *tenancy) ownedBy(t *tenant) int {
	tn.ownedMu.RLock()
	defer tn.ownedMu.RUnlock()
	n := 0
	for _, o := range tn.owned {
		if o == t {
			n++
		}
	}
	return n
}

func newTenancy(admin string, ts []TenantConfig, ss []SharedSpaceConfig) (*tenancy, error) {
	tn := &tenancy{admin: admin, byToken: map[[32]byte]*tenant{}, byCert: map[string]*tenant{}, shared: map[string]*sharedSpace{}}
	names := map[string]bool{}
	for i, c := range ts {
		if c.Token == "" {
			return nil, fmt.Errorf("tenant %q: no token", c.Name)
		}
		if c.Token == admin {
			return nil, fmt.Errorf("tenant %q: its token is the admin's", c.Name)
		}
		sp, err := keyspace.Tenant(c.Name)
		if err != nil {
			return nil, fmt.Errorf("tenant %q: %w", c.Name, err)
		}
		if names[c.Name] {
			return nil, fmt.Errorf("tenant %q: listed twice", c.Name)
		}
		names[c.Name] = true
		h := sha256.Sum256([]byte(c.Token))
		if _, dup := tn.byToken[h]; dup {
			return nil, fmt.Errorf("tenant %q: the same token as another tenant", c.Name)
		}
		t := &tenant{name: c.Name, certCN: c.ClientCertCN, index: i, space: sp, namespaces: map[string]bool{}}
		if c.ClientCertCN != "" {
			if other := tn.byCert[c.ClientCertCN]; other != nil {
				return nil, fmt.Errorf("tenant %q: client certificate %q is also tenant %q's", c.Name, c.ClientCertCN, other.name)
			}
			tn.byCert[c.ClientCertCN] = t
		}
		for _, n := range c.Namespaces {
			t.namespaces[n] = true
		}
		tn.byToken[h] = t
		tn.tenants = append(tn.tenants, t)
	}
	for _, c := range ss {
		sp, err := keyspace.Shared(c.Name)
		if err != nil {
			return nil, fmt.Errorf("shared space %q: %w", c.Name, err)
		}
		if tn.shared[c.Name] != nil {
			return nil, fmt.Errorf("shared space %q: listed twice", c.Name)
		}
		s := &sharedSpace{name: c.Name, ns: c.Namespace, space: sp, tenants: map[string]bool{}}
		for _, n := range c.Tenants {
			if !names[n] {
				return nil, fmt.Errorf("shared space %q: no tenant %q", c.Name, n)
			}
			s.tenants[n] = true
		}
		tn.shared[c.Name] = s
	}
	return tn, nil
}

// on reports whether the daemon has tenants.
func (tn *tenancy) on() bool { return len(tn.tenants) > 0 }

// open reports whether the daemon has no token at all (no admin token, no
// tenants): every caller is the admin.
func (tn *tenancy) open() bool { return tn.admin == "" && !tn.on() }

// principal is who makes a call: the admin (t nil) or a tenant.
type principal struct{ t *tenant }

type principalKey struct{}

func principalOf(ctx context.Context) principal {
	p, _ := ctx.Value(principalKey{}).(principal)
	return p
}

// errUnauthenticated is deliberately vague: it must not help guessing.
var errUnauthenticated = status.Error(codes.Unauthenticated, "missing or invalid bearer token (send metadata authorization: Bearer <token>)")

// caller is where a call comes from: the Unix socket (with its peer's
// credentials) or a remote listener (with the common name of the client
// certificate it presented and TLS verified, "" for none).
type caller struct {
	local  bool
	peer   unixPeer
	certCN string
}

// authenticate returns the principal of a call with bearer token token
// (has: one was sent) from c.
func (tn *tenancy) authenticate(token string, has bool, c caller) (principal, error) {
	open := tn.open()
	if !has {
		if open {
			return principal{}, nil
		}
		if t := tn.byCert[c.certCN]; t != nil && c.certCN != "" {
			return principal{t: t}, nil
		}
		if c.local {
			if p, ok := tn.unixPeers[c.peer.uid]; ok && c.peer.known {
				return p, nil
			}
			return principal{}, tn.unixRefusal(c.peer)
		}
		return principal{}, errUnauthenticated
	}
	if tn.admin != "" && subtle.ConstantTimeCompare([]byte(token), []byte(tn.admin)) == 1 {
		return principal{}, nil
	}
	// A map of token digests: the lookup's timing tells nothing of the
	// tokens themselves.
	if t := tn.byToken[sha256.Sum256([]byte(token))]; t != nil {
		if t.certCN != "" && !c.local && c.certCN != t.certCN {
			// A token bound to a certificate is no good without it.
			return principal{}, errUnauthenticated
		}
		return principal{t: t}, nil
	}
	if open {
		return principal{}, nil // a token the daemon does not ask for
	}
	return principal{}, errUnauthenticated
}

// unixRefusal says why a token-less call on the Unix socket is refused:
// the caller knows its own uid, so naming it tells it nothing new.
func (tn *tenancy) unixRefusal(p unixPeer) error {
	if !p.known {
		return status.Error(codes.Unauthenticated, "missing bearer token, and the kernel did not name the calling process's user (send metadata authorization: Bearer <token>)")
	}
	return status.Errorf(codes.Unauthenticated, "missing bearer token: the daemon has tokens, and uid %d is not in server.unix_peers (send metadata authorization: Bearer <token>, or map the uid)", p.uid)
}

// callerOf returns where the call of ctx comes from.
func callerOf(ctx context.Context, local bool) caller {
	if local {
		return caller{local: true, peer: unixPeerOf(ctx)}
	}
	if p, ok := peer.FromContext(ctx); ok {
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok {
			return caller{certCN: verifiedCN(ti.State)}
		}
	}
	return caller{}
}

// verifiedCN returns the common name of the client certificate a TLS
// connection presented and verified against the configured CA ("" when
// none was verified).
func verifiedCN(st tls.ConnectionState) string {
	if len(st.VerifiedChains) == 0 || len(st.VerifiedChains[0]) == 0 {
		return ""
	}
	return st.VerifiedChains[0][0].Subject.CommonName
}

// bearer returns the call's bearer token.
func bearer(ctx context.Context) (string, bool) {
	md, _ := metadata.FromIncomingContext(ctx)
	return bearerOf(md)
}

// bearerOf returns the bearer token of a call's headers, and whether the
// call sent an authorization header at all.
func bearerOf(md metadata.MD) (string, bool) {
	vs := md.Get("authorization")
	for _, v := range vs {
		if tok, ok := strings.CutPrefix(v, "Bearer "); ok {
			return tok, true
		}
	}
	return "", len(vs) > 0
}

// unary authenticates every call and keeps tenants to tenantMethods.
func (tn *tenancy) unary(local bool) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		tok, has := bearer(ctx)
		p, err := tn.authenticate(tok, has, callerOf(ctx, local))
		if err != nil {
			return nil, err
		}
		if p.t != nil && !tenantMethods[info.FullMethod] && !strings.HasPrefix(info.FullMethod, "/grpc.health.") {
			p.t.ctr.refusals.Add(1)
			return nil, status.Errorf(codes.PermissionDenied, "%s is the admin's (tenant %q may call the copying API: PutBlocks, GetBlocks, Lookup, ...)",
				info.FullMethod, p.t.name)
		}
		return h(context.WithValue(ctx, principalKey{}, p), req)
	}
}

func (tn *tenancy) stream(local bool) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		tok, has := bearer(ss.Context())
		p, err := tn.authenticate(tok, has, callerOf(ss.Context(), local))
		if err != nil {
			return err
		}
		if p.t != nil && !tenantStreams[info.FullMethod] && !strings.HasPrefix(info.FullMethod, "/grpc.health.") {
			return status.Errorf(codes.PermissionDenied, "%s is the admin's", info.FullMethod)
		}
		return h(srv, &principalStream{ss, context.WithValue(ss.Context(), principalKey{}, p)})
	}
}

// principalStream is a server stream whose context carries its principal.
type principalStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *principalStream) Context() context.Context { return s.ctx }

// scope is where a call's identifiers live: its keys' space, and its
// request identifiers' — a tenant's own, even in a shared space: "name:"
// before each (names have no ':', the admin's ids have no prefix, and
// an error quoting an id shows the tenant its name). The empty id, a
// temporary request's, stays empty.
type scope struct {
	keys keyspace.Space
	t    *tenant // nil: the admin
}

func (sc scope) req(id string) string {
	if sc.t == nil || id == "" {
		return id
	}
	return sc.t.name + ":" + id
}

func (sc scope) reqIDs(ids []string) []string {
	if sc.t == nil || len(ids) == 0 {
		return ids
	}
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = sc.req(id)
	}
	return out
}

// resolve returns the namespace a call names and its scope for p, or
// PERMISSION_DENIED before saying whether the namespace exists.
func (tn *tenancy) resolve(p principal, name string) (nsName string, sc scope, err error) {
	sc.t = p.t
	if o := tn.ownerOf(name); o != nil {
		if p.t != nil && p.t != o {
			return "", sc, tn.deny(p, name)
		}
		sc.keys = o.space
		return name, sc, nil
	}
	if sh := tn.shared[name]; sh != nil {
		if p.t != nil && !sh.tenants[p.t.name] {
			return "", sc, tn.deny(p, name)
		}
		sc.keys = sh.space
		return sh.ns, sc, nil
	}
	if p.t != nil {
		if !p.t.namespaces[name] {
			return "", sc, tn.deny(p, name)
		}
		sc.keys = p.t.space
	}
	return name, sc, nil
}

func (tn *tenancy) deny(p principal, name string) error {
	p.t.ctr.refusals.Add(1)
	var may []string
	for n := range p.t.namespaces {
		may = append(may, fmt.Sprintf("%q", n))
	}
	for n, sh := range tn.shared {
		if sh.tenants[p.t.name] {
			may = append(may, fmt.Sprintf("%q", n))
		}
	}
	slices.Sort(may)
	return fmt.Errorf("%w: tenant %q may not use namespace %q (its namespaces: %s)", ErrPermissionDenied, p.t.name, name, strings.Join(may, ", "))
}

// keysProto returns keys for the caller: a tenant gets only the keys of
// its call's space, stripped of the tag (another tenant's evicted keys
// are none of its business).
func (sc scope) keysProto(keys []offload.Key) [][]byte {
	if !sc.keys.Tagged() {
		return keysProto(keys)
	}
	var out [][]byte
	for _, k := range keys {
		if raw, ok := sc.keys.Strip(k); ok {
			out = append(out, []byte(raw))
		}
	}
	return out
}

// refused counts a call refused for want of room or over a limit against
// the tenant, and returns err as a status.
func (sc scope) refused(err error) error {
	if sc.t != nil && (errors.Is(err, ErrLimit) || errors.Is(err, ErrNoSpace) || errors.Is(err, ErrPermissionDenied)) {
		sc.t.ctr.refusals.Add(1)
	}
	return toStatus(err)
}

// countLookups counts a tenant's hits and misses.
func (sc scope) countLookups(res []offload.LookupResult) {
	if sc.t == nil {
		return
	}
	var hits, misses uint64
	for _, r := range res {
		switch r {
		case offload.Hit, offload.HitPending:
			hits++
		case offload.Miss:
			misses++
		}
	}
	sc.t.ctr.hits.Add(hits)
	sc.t.ctr.misses.Add(misses)
}

// countStored counts the blocks a tenant's put wrote.
func (sc scope) countStored(written []bool) {
	if sc.t == nil {
		return
	}
	n := uint64(0)
	for _, w := range written {
		if w {
			n++
		}
	}
	sc.t.ctr.stored.Add(n)
}

// stats returns the tenants' and shared spaces' figures in a namespace
// whose stats are st.
func (tn *tenancy) stats(st Stats) []*kvtierv1.TenantStats {
	if !tn.on() {
		return nil
	}
	out := make([]*kvtierv1.TenantStats, 0, len(tn.tenants)+len(tn.shared))
	for _, t := range tn.tenants {
		out = append(out, t.stats(st))
	}
	names := make([]string, 0, len(tn.shared))
	for n := range tn.shared {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		ts := &kvtierv1.TenantStats{Name: n, Shared: true}
		shareStats(ts, st, tn.shared[n].space)
		out = append(out, ts)
	}
	return out
}

func (t *tenant) stats(st Stats) *kvtierv1.TenantStats {
	ts := &kvtierv1.TenantStats{
		Name: t.name, Hits: t.ctr.hits.Load(), Misses: t.ctr.misses.Load(),
		Stored: t.ctr.stored.Load(), Refusals: t.ctr.refusals.Load(),
	}
	shareStats(ts, st, t.space)
	return ts
}

// shareStats fills in the figures of space sp in the primary and in the
// tiers divided between tenants.
func shareStats(ts *kvtierv1.TenantStats, st Stats, sp keyspace.Space) {
	for _, sh := range st.Shares {
		if sh.Space == sp.ID() {
			ts.PrimaryBytes = int64(sh.Held) * st.Primary.SlotSize
			ts.PrimaryQuotaBytes = int64(sh.Quota) * st.Primary.SlotSize
			ts.Evicted, ts.EvictedByOthers = sh.Evicted, sh.EvictedByOthers
		}
	}
	for _, t := range st.Tiers {
		for _, sh := range t.Shares {
			if sh.Space == sp.ID() {
				ts.Tiers = append(ts.Tiers, &kvtierv1.TenantTierStats{Tier: t.Name, Bytes: sh.Bytes, QuotaBytes: sh.Quota})
			}
		}
	}
}

// tenantStats answers a tenant's Stats (or anyone's of a shared space):
// its own figures, the slot size and the stream's address.
func (sv *service) tenantStats(ctx context.Context, p principal, name string) (*kvtierv1.StatsResponse, error) {
	ns, sc, err := sv.open(ctx, name)
	if err != nil {
		return nil, err
	}
	st, err := ns.Stats()
	if err != nil {
		return nil, toStatus(err)
	}
	// The slot size and the stream's address, which a client needs to
	// put blocks; nothing else of the namespace.
	out := &kvtierv1.StatsResponse{Namespace: name, Primary: &kvtierv1.PrimaryStats{SlotSize: st.Primary.SlotSize}, StreamAddr: sv.s.StreamAddr()}
	if sh := sv.s.tenancy.shared[name]; sh != nil {
		ts := &kvtierv1.TenantStats{Name: sh.name, Shared: true}
		shareStats(ts, st, sh.space)
		out.Tenants = append(out.Tenants, ts)
	}
	if p.t != nil {
		out.Tenants = append(out.Tenants, p.t.stats(st))
	} else if sc.t == nil && sv.s.tenancy.shared[name] == nil {
		out.Tenants = sv.s.tenancy.stats(st)
	}
	return out, nil
}

// spaceName returns the tenant or shared space whose key space has ID id,
// "" for none (the untagged pool).
func (tn *tenancy) spaceName(id uint64) string {
	for _, t := range tn.tenants {
		if t.space.ID() == id {
			return t.name
		}
	}
	for _, s := range tn.shared {
		if s.space.ID() == id {
			return s.name
		}
	}
	return ""
}
