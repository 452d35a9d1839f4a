package server

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvtier/kvtier/cpu"
	"github.com/kvtier/kvtier/keyspace"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/tiering"
)

// EventSink receives the events of every step, in order (the events
// package's publisher). Publish must not block on subscribers; an error
// means the events were not queued (they are counted as dropped).
type EventSink interface {
	Publish(evs []offload.Event) error
}

// MetaRecorder attaches token metadata to keys for self-describing events
// (the events package's tracker).
type MetaRecorder interface {
	Record(key offload.Key, meta BlockMeta) error
}

// BlockMeta is the token metadata of one block (docs/semantics.md §6.3), as sent with
// PrepareStore.
type BlockMeta struct {
	BlockHashes   [][]byte
	ParentHash    []byte
	TokenIDs      []int64
	BlockSize     int
	LoraID        *int64
	LoraName      *string
	SpecKind      string
	SlidingWindow *int64
}

// SharedArena is an arena another process can map: the cpu/arena package's
// File and Memfd arenas.
type SharedArena interface {
	// Kind is "anonymous", "file" or "memfd".
	Kind() string
	// Path is the backing file of a file arena.
	Path() string
	// File is the backing file or memfd (nil for anonymous memory). The
	// arena keeps ownership.
	File() *os.File
}

// NamespaceConfig describes one namespace: a manager and the arena of its
// primary tier.
type NamespaceConfig struct {
	// Name selects the namespace in API calls; "" is the default namespace.
	Name string
	// Manager is the namespace's tiering manager; Close closes it.
	Manager *tiering.Manager
	// Arena is the primary tier's slot memory (PutBlocks/GetBlocks copy
	// through it).
	Arena offload.Arena
	// Share, if set, lets engines map the arena (GetArena).
	Share SharedArena
	// Parser holds the default filters and the validation mode. Its
	// OnWarning is chained after the server's warning log and metrics.
	Parser offload.Parser
	// Events, if set, receives the events of every step. If it has a
	// Close(context.Context) error method, Close calls it after the last
	// events were published.
	Events EventSink
	// Meta, if set, records PrepareStore's token metadata.
	Meta MetaRecorder
	// Stats, if set, reports counters for the Stats call and metrics. It
	// runs under the namespace mutex.
	Stats func() Stats
	// EventStats, if set, reports the sink's own counters: events it
	// published and batches it dropped (queue or subscriber overflow).
	EventStats func() (published, droppedBatches uint64)
	// Blocks, if set, lists the primary's ready keys from a slot on
	// (cpu.Primary.Keys); it runs under the namespace mutex. Without it
	// ListBlocks is refused.
	Blocks func(from int64, limit int, dst []offload.Key) ([]offload.Key, int64)
	// Quota, if set, returns the primary's quota in slots of the owner of
	// key space space (cpu.Primary.Quotas; 0 for none). It must be safe
	// without the namespace mutex.
	Quota func(space uint64) int
	// Feed, if set, says where the namespace's events are published; it
	// runs under the namespace mutex, so its NextSeq is a cut of the
	// events against the primary's state.
	Feed func() EventFeed
}

// notLookedUp marks keys after the first non-hit of a prefix lookup.
const notLookedUp offload.LookupResult = 255

// Namespace is one manager with its request registry. All methods are safe
// for concurrent use; they are serialised by a mutex.
type Namespace struct {
	name string
	// epoch tells this instance of the namespace from any other of the
	// same name (a restarted daemon's): engines send it with every step
	// and their workers map the arena of that epoch (engine.go).
	epoch  uint64
	limits Limits
	// leases are the free slots leased to each engine session (manager
	// mode, engine.go); guarded by mu.
	leases map[*session]map[int64]struct{}
	arena  offload.Arena
	// sums are the stream checksums of primary blocks (stream.go).
	sums  *blockSums
	share SharedArena
	// sharePath is share's path made absolute.
	sharePath string
	events    EventSink
	meta      MetaRecorder
	stats     func() Stats
	evst      func() (uint64, uint64)
	blocks    func(from int64, limit int, dst []offload.Key) ([]offload.Key, int64)
	quota     func(space uint64) int
	feed      func() EventFeed
	log       *slog.Logger
	// onWarning counts and logs lenient-mode warnings of NewRequest.
	onWarning func(offload.Warning)

	// paramTotal counts the kv_transfer_params bytes of every namespace's
	// requests (the server's), against Limits.MaxParamsBytesTotal.
	paramTotal *atomic.Int64

	mu        sync.Mutex
	mgr       *tiering.Manager
	parser    offload.Parser
	reqs      map[string]*request // by manager-wide id
	bySession map[*session]map[*request]struct{}
	byOwner   map[string]int // active requests per tenant (request.owner)
	ephemeral uint64         // counter for PutBlocks/GetBlocks request ids
	closed    bool
	published uint64 // events handed to the sink
	dropped   uint64 // events the sink refused
	// lastStep is when the engine last ended a step (or the daemon did,
	// see autoStep); autoSteps counts the steps the daemon ran itself.
	lastStep  time.Time
	autoSteps uint64
	// prefetches numbers the prefetches' request contexts (steer.go).
	prefetches uint64
	// deleted counts the blocks Delete removed, by tier ("primary" for the
	// primary); guarded by mu.
	deleted map[string]uint64
	// expired counts requests released after RequestIdleTimeout without a
	// call; released those released because their session ended.
	expired, released uint64
	// loadsMissing counts keys PrepareLoad found gone since their lookup.
	loadsMissing uint64
	// refusedFull and refusedSession count NewRequest calls refused
	// because the namespace's request table was full, or the session held
	// its cap.
	refusedFull, refusedSession uint64
}

func newNamespace(cfg NamespaceConfig, limits Limits, log *slog.Logger, onWarning func(offload.Warning), paramTotal *atomic.Int64) (*Namespace, error) {
	if cfg.Manager == nil {
		return nil, fmt.Errorf("namespace %q: no manager", cfg.Name)
	}
	if cfg.Arena == nil || cfg.Arena.SlotSize() <= 0 || cfg.Arena.NumSlots() <= 0 {
		return nil, fmt.Errorf("namespace %q: no arena", cfg.Name)
	}
	ns := &Namespace{
		name:       cfg.Name,
		epoch:      newEpoch(),
		limits:     limits,
		arena:      cfg.Arena,
		sums:       newBlockSums(cfg.Arena.NumSlots()),
		share:      cfg.Share,
		events:     cfg.Events,
		meta:       cfg.Meta,
		stats:      cfg.Stats,
		evst:       cfg.EventStats,
		blocks:     cfg.Blocks,
		quota:      cfg.Quota,
		feed:       cfg.Feed,
		log:        log.With("namespace", cfg.Name),
		onWarning:  onWarning,
		mgr:        cfg.Manager,
		parser:     cfg.Parser,
		reqs:       make(map[string]*request),
		bySession:  make(map[*session]map[*request]struct{}),
		byOwner:    make(map[string]int),
		paramTotal: paramTotal,
		lastStep:   time.Now(),
	}
	if ns.paramTotal == nil {
		ns.paramTotal = new(atomic.Int64)
	}
	if cfg.Share != nil && cfg.Share.Path() != "" {
		// Clients open this path from their own working directory.
		abs, err := filepath.Abs(cfg.Share.Path())
		if err != nil {
			return nil, fmt.Errorf("namespace %q: arena path: %w", cfg.Name, err)
		}
		ns.sharePath = abs
	}
	userHook := cfg.Parser.OnWarning
	ns.parser.OnWarning = func(w offload.Warning) {
		if onWarning != nil {
			onWarning(w)
		}
		if userHook != nil {
			userHook(w)
		}
	}
	return ns, nil
}

// Name returns the namespace's name ("" for the default namespace).
func (ns *Namespace) Name() string { return ns.name }

// SlotSize returns the arena's bytes per slot (= per block).
func (ns *Namespace) SlotSize() int { return ns.arena.SlotSize() }

// lock acquires the mutex unless the namespace is closed.
func (ns *Namespace) lock() error {
	ns.mu.Lock()
	if ns.closed {
		ns.mu.Unlock()
		return ErrClosed
	}
	return nil
}

// checkParams bounds a kv_transfer_params document.
func (ns *Namespace) checkParams(params []byte) error {
	if len(params) > ns.limits.MaxParamsBytes {
		return fmt.Errorf("%w: kv_transfer_params is %d bytes (max %d)", ErrLimit, len(params), ns.limits.MaxParamsBytes)
	}
	return nil
}

// NewRequest registers request id of session s with its
// kv_transfer_params (JSON). The request belongs to s: its id is s's own,
// and it ends with s.
// owner is the tenant making it ("" for the admin), whose requests in the
// namespace Limits.MaxTenantRequests bounds across its connections.
func (ns *Namespace) NewRequest(s *session, owner, id string, params []byte) (*offload.ReqContext, offload.OffloadPolicy, error) {
	if err := ns.lock(); err != nil {
		return nil, 0, err
	}
	defer ns.mu.Unlock()
	if owner != "" && ns.byOwner[owner] >= ns.limits.MaxTenantRequests {
		ns.refusedSession++
		return nil, 0, fmt.Errorf("%w: tenant %q holds %d active requests in namespace %q over all its connections (limits.max_tenant_requests %d); finish requests",
			ErrLimit, owner, ns.byOwner[owner], ns.name, ns.limits.MaxTenantRequests)
	}
	rc, policy, err := ns.newRequestLocked(s, id, params)
	if err == nil && owner != "" {
		r := ns.reqs[rc.ID]
		r.owner = owner
		ns.byOwner[owner]++
	}
	return rc, policy, err
}

// newRequestLocked is NewRequest with the mutex held.
func (ns *Namespace) newRequestLocked(s *session, id string, params []byte) (*offload.ReqContext, offload.OffloadPolicy, error) {
	if id == "" {
		return nil, 0, fmt.Errorf("%w: empty request id", ErrInvalidArgument)
	}
	if len(id) > ns.limits.MaxKeyBytes {
		return nil, 0, fmt.Errorf("%w: request id is %d bytes (max %d)", ErrInvalidArgument, len(id), ns.limits.MaxKeyBytes)
	}
	if err := ns.checkParams(params); err != nil {
		return nil, 0, err
	}
	if s != nil && s.closed.Load() {
		return nil, 0, fmt.Errorf("%w: %s has ended", ErrClosed, s)
	}
	key := s.scope(id)
	if _, ok := ns.reqs[key]; ok {
		return nil, 0, fmt.Errorf("%w: %q", ErrRequestExists, id)
	}
	if len(ns.reqs) >= ns.limits.MaxRequests {
		ns.refusedFull++
		return nil, 0, fmt.Errorf("%w: %d active requests in namespace %q (max %d); finish requests", ErrLimit, len(ns.reqs), ns.name, ns.limits.MaxRequests)
	}
	if s != nil && len(ns.bySession[s]) >= ns.limits.MaxSessionRequests {
		ns.refusedSession++
		return nil, 0, fmt.Errorf("%w: this session holds %d active requests in namespace %q (limits.max_session_requests %d); finish requests",
			ErrLimit, len(ns.bySession[s]), ns.name, ns.limits.MaxSessionRequests)
	}
	rc, err := ns.parser.NewReqContext(key, params)
	if err != nil {
		return nil, 0, fmt.Errorf("request %q: %w", id, err)
	}
	n := int64(len(rc.Params))
	if s != nil {
		if held := s.paramBytes.Load(); held+n > ns.limits.MaxSessionParamsBytes {
			return nil, 0, fmt.Errorf("%w: this session's requests hold %d bytes of kv_transfer_params (max %d); finish requests", ErrLimit, held, ns.limits.MaxSessionParamsBytes)
		}
	}
	if held := ns.paramTotal.Load(); held+n > ns.limits.MaxParamsBytesTotal {
		return nil, 0, fmt.Errorf("%w: active requests hold %d bytes of kv_transfer_params (max %d in all)", ErrLimit, held, ns.limits.MaxParamsBytesTotal)
	}
	policy := ns.mgr.OnNewRequest(rc)
	ns.register(&request{ctx: rc, sess: s, id: id, params: n})
	return rc, policy, nil
}

// Keys converts raw keys into keys of space sp, checking the per-call
// count and each key's length against the limits.
func (ns *Namespace) Keys(raw [][]byte, sp keyspace.Space) ([]offload.Key, error) {
	return ns.limits.keys(raw, sp)
}

// PackedKeys splits keys stored back to back, size bytes each, into keys
// of space sp, checking the same limits as Keys. It makes one allocation
// for the whole batch.
func (ns *Namespace) PackedKeys(packed []byte, size int, sp keyspace.Space) ([]offload.Key, error) {
	return ns.limits.packedKeys(packed, size, sp)
}

// keys is Namespace.Keys under limits l.
func (l Limits) keys(raw [][]byte, sp keyspace.Space) ([]offload.Key, error) {
	if len(raw) > l.MaxKeysPerCall {
		return nil, fmt.Errorf("%w: %d keys in one call (max %d)", ErrLimit, len(raw), l.MaxKeysPerCall)
	}
	maxLen := l.maxKeyBytes(sp)
	keys := make([]offload.Key, len(raw))
	for i, b := range raw {
		if len(b) <= offload.GroupSuffixLen || len(b) > maxLen {
			what := "too short"
			if len(b) > maxLen {
				what = "too long"
			}
			return nil, fmt.Errorf("%w: keys[%d]: key %s: %d bytes (want %d..%d: block hash + 4-byte group index)",
				offload.ErrInvalidKey, i, what, len(b), offload.GroupSuffixLen+1, maxLen)
		}
		keys[i] = sp.Key(b)
	}
	return keys, nil
}

// maxKeyBytes is the longest key a caller in space sp may send: the limit,
// less the tag a space adds within offload.MaxKeyLen.
func (l Limits) maxKeyBytes(sp keyspace.Space) int {
	if sp.Tagged() {
		return min(l.MaxKeyBytes, offload.MaxKeyLen-keyspace.TagLen)
	}
	return l.MaxKeyBytes
}

// packedKeys is Namespace.PackedKeys under limits l.
func (l Limits) packedKeys(packed []byte, size int, sp keyspace.Space) ([]offload.Key, error) {
	if maxLen := l.maxKeyBytes(sp); size <= offload.GroupSuffixLen || size > maxLen {
		return nil, fmt.Errorf("%w: key_size %d (want %d..%d: block hash + 4-byte group index)",
			offload.ErrInvalidKey, size, offload.GroupSuffixLen+1, maxLen)
	}
	if len(packed)%size != 0 {
		return nil, fmt.Errorf("%w: packed_keys is %d bytes, not a multiple of key_size %d", ErrInvalidArgument, len(packed), size)
	}
	n := len(packed) / size
	if n > l.MaxKeysPerCall {
		return nil, fmt.Errorf("%w: %d keys in one call (max %d)", ErrLimit, n, l.MaxKeysPerCall)
	}
	return splitKeys(packed, size, n, sp), nil
}

// splitKeys splits n keys stored back to back, size bytes each, into keys
// of space sp (each behind its tag), in one allocation for the batch.
func splitKeys(packed []byte, size, n int, sp keyspace.Space) []offload.Key {
	keys := make([]offload.Key, n)
	tag := sp.Key(nil) // "" for the untagged space
	step := len(tag) + size
	all := string(packed)
	if len(tag) > 0 {
		buf := make([]byte, 0, n*step)
		for i := range n {
			buf = append(buf, tag...)
			buf = append(buf, packed[i*size:(i+1)*size]...)
		}
		all = string(buf)
	}
	for i := range keys {
		keys[i] = offload.Key(all[i*step : (i+1)*step])
	}
	return keys
}

// Lookup looks keys up for request id into out (len(out) >= len(keys)).
// Without prefix every key is looked up. With prefix the scan is the
// connector's prefix scan (tiering.Manager.LookupPrefix): a Retry ends the
// hit count but the scan goes on so that later keys start their checks and
// promotions, and the first Miss ends the scan; keys after it answer
// notLookedUp. It returns the number of leading hits (Hit or HitPending).
func (ns *Namespace) Lookup(s *session, id string, keys []offload.Key, prefix bool, out []offload.LookupResult) (int, error) {
	r, err := ns.lockLive(s, id, "lookup")
	if err != nil {
		return 0, err
	}
	defer ns.mu.Unlock()
	if !prefix {
		return ns.lookupLocked(r.ctx, keys, out), nil
	}
	hits := ns.mgr.LookupPrefix(keys, r.ctx, out)
	for i, res := range out[:len(keys)] {
		if res == offload.Miss {
			for j := i + 1; j < len(keys); j++ {
				out[j] = notLookedUp
			}
			break
		}
	}
	return hits, nil
}

// lookupLocked looks every key up and returns the leading hits.
func (ns *Namespace) lookupLocked(rc *offload.ReqContext, keys []offload.Key, out []offload.LookupResult) int {
	hits, inPrefix := 0, true
	for i, k := range keys {
		res := ns.mgr.Lookup(k, rc)
		out[i] = res
		if inPrefix && (res == offload.Hit || res == offload.HitPending) {
			hits++
		} else {
			inPrefix = false
		}
	}
	return hits
}

// PrepareLoad pins keys for reading and returns their slots. A key that
// is no longer readable — another client's stores evicted it since the
// Lookup that answered HIT — fails the call and pins nothing, or, with
// allowMissing, answers slot -1 and is not pinned while the others are;
// either way it is counted (missing: the -1s).
func (ns *Namespace) PrepareLoad(s *session, id string, keys []offload.Key, allowMissing bool) (slots []int64, missing int, err error) {
	r, err := ns.lockLive(s, id, "prepare load")
	if err != nil {
		return nil, 0, err
	}
	defer ns.mu.Unlock()
	if allowMissing {
		slots, missing, err = ns.mgr.PrepareLoadPresent(keys)
	} else {
		slots, err = ns.mgr.PrepareLoad(keys, r.ctx)
	}
	if err != nil {
		if errors.Is(err, cpu.ErrUnknownKey) || errors.Is(err, cpu.ErrNotReady) {
			ns.loadsMissing++
			return nil, 0, fmt.Errorf("%w: prepare load: %w (evicted or rewritten since the lookup; set allow_missing to pin the rest)", ErrProtocol, err)
		}
		return nil, 0, fmt.Errorf("%w: prepare load: %w", ErrProtocol, err)
	}
	ns.loadsMissing += uint64(missing)
	if r.pins == nil {
		r.pins = make(map[offload.Key]int32, len(keys))
	}
	for i, k := range keys {
		if slots[i] >= 0 {
			r.pins[k]++
		}
	}
	return slots, missing, nil
}

// CompleteLoad unpins keys pinned by PrepareLoad.
func (ns *Namespace) CompleteLoad(s *session, id string, keys []offload.Key) error {
	r, err := ns.lockReq(s, id)
	if err != nil {
		return err
	}
	defer ns.mu.Unlock()
	return ns.completeLoadLocked(r, id, keys)
}

// completeLoadLocked unpins keys r pinned; the caller holds the mutex.
func (ns *Namespace) completeLoadLocked(r *request, id string, keys []offload.Key) error {
	// Check the whole batch first (a key may repeat) so that a bad call
	// changes nothing.
	seen := make(map[offload.Key]int32, len(keys))
	for i, k := range keys {
		seen[k]++
		if seen[k] > r.pins[k] {
			return fmt.Errorf("%w: complete load: keys[%d] %s is not pinned by request %q (PrepareLoad first)", ErrProtocol, i, k, id)
		}
	}
	if err := ns.mgr.CompleteLoad(keys, r.ctx); err != nil {
		return fmt.Errorf("%w: complete load: %w", ErrProtocol, err)
	}
	for k, n := range seen {
		if r.pins[k] -= n; r.pins[k] <= 0 {
			delete(r.pins, k)
		}
	}
	ns.maybeDropLocked(r)
	return nil
}

// Touch refreshes the recency of keys.
func (ns *Namespace) Touch(s *session, id string, keys []offload.Key) error {
	r, err := ns.lockReq(s, id)
	if err != nil {
		return err
	}
	defer ns.mu.Unlock()
	ns.mgr.Touch(keys, r.ctx)
	return nil
}

// PrepareStore reserves slots for keys; metas is empty or co-indexed with
// keys. ok is false when the primary cannot make room.
func (ns *Namespace) PrepareStore(s *session, id string, keys []offload.Key, metas []BlockMeta) (out offload.PrepareStoreOutput, ok bool, err error) {
	r, err := ns.lockLive(s, id, "prepare store")
	if err != nil {
		return out, false, err
	}
	defer ns.mu.Unlock()
	if err := ns.recordMetasLocked(keys, metas); err != nil {
		return out, false, err
	}
	out, ok, err = ns.mgr.PrepareStore(keys, r.ctx)
	if err != nil {
		return out, false, fmt.Errorf("%w: prepare store: %w", ErrProtocol, err)
	}
	if ok && len(out.KeysToStore) > 0 {
		if r.reserved == nil {
			r.reserved = make(map[offload.Key]struct{}, len(out.KeysToStore))
		}
		for _, k := range out.KeysToStore {
			r.reserved[k] = struct{}{}
		}
	}
	return out, ok, nil
}

// recordMetasLocked attaches token metadata to the keys about to be
// stored, for self-describing events; metas is empty or co-indexed with
// keys, and an entry without block hashes describes nothing. ns.mu is
// held.
func (ns *Namespace) recordMetasLocked(keys []offload.Key, metas []BlockMeta) error {
	if len(metas) != 0 && len(metas) != len(keys) {
		return fmt.Errorf("%w: %d metadata entries for %d keys (want none or one per key)", ErrInvalidArgument, len(metas), len(keys))
	}
	if ns.meta == nil {
		return nil
	}
	for i := range metas {
		if len(metas[i].BlockHashes) == 0 && len(metas[i].TokenIDs) == 0 {
			continue
		}
		if err := ns.meta.Record(keys[i], metas[i]); err != nil {
			return fmt.Errorf("%w: metadata[%d]: %w", ErrInvalidArgument, i, err)
		}
	}
	return nil
}

// CompleteStore commits or abandons the slots reserved by PrepareStore.
func (ns *Namespace) CompleteStore(s *session, id string, keys []offload.Key, success bool) error {
	r, err := ns.lockReq(s, id)
	if err != nil {
		return err
	}
	defer ns.mu.Unlock()
	for i, k := range keys {
		if _, ok := r.reserved[k]; !ok {
			return fmt.Errorf("%w: complete store: keys[%d] %s was not reserved for request %q (only PrepareStore's keys_to_store may be completed)", ErrProtocol, i, k, id)
		}
	}
	if err := ns.mgr.CompleteStore(keys, r.ctx, success); err != nil {
		return fmt.Errorf("%w: complete store: %w", ErrProtocol, err)
	}
	for _, k := range keys {
		delete(r.reserved, k)
	}
	ns.maybeDropLocked(r)
	return nil
}

// FinishRequest marks request id finished.
func (ns *Namespace) FinishRequest(s *session, id string) error {
	r, err := ns.lockReq(s, id)
	if err != nil {
		return err
	}
	defer ns.mu.Unlock()
	return ns.finishLocked(r, id)
}

// finishLocked finishes r; the caller holds the mutex.
func (ns *Namespace) finishLocked(r *request, id string) error {
	if r.expired {
		r.expired = false // the client has noticed; finishing it is a no-op
		ns.maybeDropLocked(r)
		return nil
	}
	if r.finished {
		return fmt.Errorf("%w: request %q already finished", ErrProtocol, id)
	}
	r.finished = true
	ns.mgr.OnRequestFinished(r.ctx)
	ns.maybeDropLocked(r)
	return nil
}

func (ns *Namespace) maybeDropLocked(r *request) {
	if r.finished && r.idle() {
		ns.unregister(r)
	}
}

// autoStep ends a step on the engine's behalf when it has not for
// AutoStepInterval while tier work is pending, so that a client that only
// stores (PutBlocks) and never calls ScheduleEnd does not keep cascades
// pinned forever.
func (ns *Namespace) autoStep(now time.Time) {
	if ns.limits.AutoStepInterval < 0 {
		return
	}
	if err := ns.lock(); err != nil {
		return
	}
	defer ns.mu.Unlock()
	if now.Sub(ns.lastStep) < ns.limits.AutoStepInterval || !ns.mgr.HasPendingWork() {
		return
	}
	ns.mgr.ScheduleEnd(offload.ScheduleEnd{})
	ns.publishLocked()
	ns.lastStep = now
	ns.autoSteps++
}

// ScheduleEnd ends one engine step and publishes its events. It reports
// whether work is still in flight and how many events were published.
func (ns *Namespace) ScheduleEnd(se offload.ScheduleEnd) (pending bool, published int, err error) {
	if n := len(se.NewReqIDs) + len(se.PreemptedReqIDs); n > ns.limits.MaxKeysPerCall {
		return false, 0, fmt.Errorf("%w: %d request ids in one call (max %d)", ErrLimit, n, ns.limits.MaxKeysPerCall)
	}
	if err := ns.lock(); err != nil {
		return false, 0, err
	}
	defer ns.mu.Unlock()
	ns.mgr.ScheduleEnd(se)
	ns.lastStep = time.Now()
	published = ns.publishLocked()
	return ns.mgr.HasPendingWork(), published, nil
}

// publishLocked hands the manager's buffered events to the sink. Without a
// sink they are taken and dropped so that nothing accumulates.
func (ns *Namespace) publishLocked() int {
	evs := ns.mgr.TakeEvents()
	if len(evs) == 0 || ns.events == nil {
		return 0
	}
	if err := ns.events.Publish(evs); err != nil {
		ns.dropped += uint64(len(evs))
		ns.log.Warn("events not published", "events", len(evs), "err", err)
		return 0
	}
	ns.published += uint64(len(evs))
	return len(evs)
}

// Sources names, for each key, where its block is (see
// tiering.Manager.Source); all "" when the manager cannot tell.
func (ns *Namespace) Sources(keys []offload.Key) ([]string, error) {
	if err := ns.lock(); err != nil {
		return nil, err
	}
	defer ns.mu.Unlock()
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = ns.mgr.Source(k)
	}
	return out, nil
}

// Reset drops every block of the primary tier that no client holds.
// Blocks a client has pinned for reading or reserved for writing stay,
// and so do the client's claims on them: a reset never frees a slot a
// client may still read or write through the arena, so no client can make
// another read bytes it did not store.
func (ns *Namespace) Reset(ctx context.Context) error {
	if err := ns.lock(); err != nil {
		return err
	}
	defer ns.mu.Unlock()
	if err := ns.mgr.Reset(ctx); err != nil {
		return fmt.Errorf("reset namespace %q: %w", ns.name, err)
	}
	ns.publishLocked()
	return nil
}

// Stats reports the namespace's counters.
func (ns *Namespace) Stats() (Stats, error) {
	if err := ns.lock(); err != nil {
		return Stats{}, err
	}
	defer ns.mu.Unlock()
	var st Stats
	if ns.stats != nil {
		st = ns.stats()
	} else {
		st.Primary.SlotSize = int64(ns.arena.SlotSize())
		st.Primary.NumSlots = int64(ns.arena.NumSlots())
		for _, t := range ns.mgr.Tiers() {
			st.Tiers = append(st.Tiers, TierStats{Name: t.Name(), Type: t.Type(), Medium: t.Medium(), Locality: t.Locality()})
		}
	}
	st.Namespace = ns.name
	st.ActiveRequests = len(ns.reqs)
	st.Sessions = len(ns.bySession)
	st.ExpiredRequests, st.ReleasedRequests, st.AutoSteps = ns.expired, ns.released, ns.autoSteps
	st.RefusedFull, st.RefusedSession = ns.refusedFull, ns.refusedSession
	st.LoadsMissing = ns.loadsMissing
	st.Prefetch = ns.mgr.PrefetchStats()
	st.Pins = ns.mgr.PinStats()
	if len(ns.deleted) > 0 {
		st.Deleted = maps.Clone(ns.deleted)
	}
	st.EventsPublished, st.EventsDropped = ns.published, ns.dropped
	if ns.evst != nil {
		st.SinkEventsPublished, st.SinkBatchesDropped = ns.evst()
	}
	return st, nil
}

// ArenaInfo describes the arena for GetArena.
type ArenaInfo struct {
	Kind     string // anonymous, file, memfd
	SlotSize int
	NumSlots int
	Path     string
	// Epoch is the namespace's epoch: slots are slots of this arena.
	Epoch uint64
	file  *os.File
}

// Arena describes the namespace's arena.
func (ns *Namespace) Arena() ArenaInfo {
	info := ArenaInfo{Kind: "anonymous", SlotSize: ns.arena.SlotSize(), NumSlots: ns.arena.NumSlots(), Epoch: ns.epoch}
	if ns.share != nil {
		info.Kind = ns.share.Kind()
		info.Path = ns.sharePath
		info.file = ns.share.File()
	}
	return info
}

// Close ends the namespace: it finishes every request, keeps ending steps
// while transfers are in flight (until ctx ends) so that their results and
// events are processed, publishes the last events, closes the manager
// (which answers whatever is still outstanding and releases every pin) and
// closes the event sink. Later calls fail with ErrClosed.
func (ns *Namespace) Close(ctx context.Context) error {
	ns.mu.Lock()
	defer ns.mu.Unlock()
	if ns.closed {
		return nil
	}
	ns.closed = true
	var errs []error
	for _, r := range ns.reqs {
		if !r.finished {
			ns.mgr.OnRequestFinished(r.ctx)
		}
		ns.unregister(r)
	}
	// Drain: in-flight cascades finish and emit their events.
	backoff := 200 * time.Microsecond
	for ns.mgr.HasPendingWork() && ctx.Err() == nil {
		ns.mgr.ScheduleEnd(offload.ScheduleEnd{})
		ns.publishLocked()
		if !ns.mgr.HasPendingWork() {
			break
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
		backoff = min(backoff*2, 10*time.Millisecond)
	}
	ns.mgr.ScheduleEnd(offload.ScheduleEnd{})
	ns.publishLocked()
	if err := ns.mgr.Close(ctx); err != nil {
		errs = append(errs, fmt.Errorf("namespace %q: close manager: %w", ns.name, err))
	}
	if c, ok := ns.events.(interface{ Close(context.Context) error }); ok {
		if err := c.Close(ctx); err != nil {
			errs = append(errs, fmt.Errorf("namespace %q: close events: %w", ns.name, err))
		}
	}
	return errors.Join(errs...)
}

// newEpoch draws a namespace epoch: random, so that no two instances of
// a namespace (across restarts of the daemon) share one, and never 0,
// which engines send for "no check".
func newEpoch() uint64 {
	for {
		var b [8]byte
		rand.Read(b[:]) // never fails (crypto/rand)
		if e := binary.LittleEndian.Uint64(b[:]); e != 0 {
			return e
		}
	}
}
