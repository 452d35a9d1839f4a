package tiering

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"

	"github.com/kvtier/kvtier/cpu"
	"github.com/kvtier/kvtier/offload"
)

// MaxTiers bounds the number of secondary tiers of one manager (request
// state keeps a bit per tier).
const MaxTiers = 64

// Errors returned by the manager.
var (
	// ErrUnknownRequest reports a store call for a request the manager was
	// not told about with OnNewRequest, or that has been finalised.
	ErrUnknownRequest = errors.New("tiering: unknown request")
	// ErrRequestFinished reports a PrepareStore after OnRequestFinished.
	ErrRequestFinished = errors.New("tiering: request already finished")
	// ErrClosed reports a call after Close.
	ErrClosed = errors.New("tiering: manager closed")
)

// Config configures a Manager.
type Config struct {
	// Primary is the CPU primary tier. The manager owns it after New and
	// closes it in Close.
	Primary *cpu.Primary
	// Tiers are the secondary tiers in lookup priority order. The manager
	// owns them after New and closes them in Close.
	Tiers []offload.SecondaryTier
	// Logger receives warnings and back-pressure transitions; nil discards.
	Logger *slog.Logger
	// HitPendingOnPromotion makes a lookup that starts a promotion answer
	// HitPending (later vLLM, #51840) instead of Retry (PR #48123 era, the
	// behaviour of acceptance cases 12, 18, 23 and 24).
	HitPendingOnPromotion bool
	// Admission configures back-pressure; the zero value means defaults.
	Admission AdmissionConfig
	// Budget bounds the primary slots cascades in flight may pin; the zero
	// value means defaults.
	Budget BudgetConfig
}

// Manager is the tiering manager: the CPU primary in front of a Stack of
// secondary tiers. It is not safe for concurrent use.
type Manager struct {
	primary    *cpu.Primary
	stack      *Stack
	log        *slog.Logger
	hitPending bool
	bg         *offload.ReqContext // stands in for a nil request context

	// polled is the once-per-step completion gate (§4.2).
	polled bool
	// promos are this step's promotions per tier, one batch per request in
	// the order requests first hit the tier.
	promos []promoQueue
	// pendingPromos counts keys reserved for promotion and not yet
	// submitted.
	pendingPromos int
	// promotions counts promotions started (slots reserved).
	promotions uint64
	reqs       map[string]*reqState
	closed     bool

	one      [1]offload.Key             // scratch for single-key primary calls
	promoOut offload.PrepareStoreOutput // scratch output of a promotion's reservation
}

// promoQueue holds one tier's promotions of the current step; n of its
// batches are in use.
type promoQueue struct {
	batches []promoBatch
	n       int
}

type promoBatch struct {
	req   *offload.ReqContext
	keys  []offload.Key
	slots []int64
}

// reqState is the manager's per-request lifecycle state (§4.7).
type reqState struct {
	req           *offload.ReqContext
	policy        offload.OffloadPolicy
	pendingStores int // reserved slots not yet completed, in keys
	finished      bool
	// requestLevel has bit i set when tier i asked for request-level
	// stores and the request's store filter allows it.
	requestLevel uint64
}

// New builds a manager over cfg.Primary and cfg.Tiers.
func New(cfg Config) (*Manager, error) {
	if cfg.Primary == nil {
		return nil, errors.New("tiering: no primary tier")
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m := &Manager{
		primary:    cfg.Primary,
		log:        log,
		hitPending: cfg.HitPendingOnPromotion,
		bg:         offload.Background(""),
		reqs:       make(map[string]*reqState),
	}
	st, err := NewStack(StackConfig{
		Tiers:     cfg.Tiers,
		Arena:     cfg.Primary.Arena(),
		Driver:    primaryDriver{m},
		Logger:    log,
		Admission: cfg.Admission,
		Budget:    cfg.Budget,
		Revocable: true,
	})
	if err != nil {
		return nil, err
	}
	m.stack = st
	cfg.Primary.SetRevoker(st.Revoke)
	m.promos = make([]promoQueue, st.Len())
	return m, nil
}

// primaryDriver lets the stack pin and resolve the primary's slots.
type primaryDriver struct{ m *Manager }

// PinCascade pins keys softly (cpu.Primary.PinSoft), finding a batch just
// stored without hashing; a key no longer ready (evicted or re-reserved
// since the caller saw it) is left out. Soft pins keep the blocks in the
// eviction order: eviction withdraws a queued cascade rather than evict
// a more recent block (Stack.Revoke).
func (d primaryDriver) PinCascade(keys []offload.Key) ([]offload.Key, []int64, error) {
	p := d.m.primary
	slots, err := p.PinSoft(keys)
	if err == nil {
		return keys, slots, nil
	}
	if keys = d.m.readyKeys(keys); len(keys) == 0 {
		return nil, nil, nil
	}
	slots, err = p.PinSoft(keys)
	return keys, slots, err
}

func (d primaryDriver) PinAgain(slots []int64) error { return d.m.primary.PinSlotsSoft(slots) }

func (d primaryDriver) CascadeDone(j *offload.Job) {
	if err := d.m.primary.UnpinSoft(j.Slots); err != nil {
		d.m.log.Error("tiering: cannot unpin cascade source blocks", "job", j.ID, "err", err)
	}
}

// ReleaseBlock implements BlockReleaser: Revoke gives back single blocks
// of cascades in flight while the primary evicts.
func (d primaryDriver) ReleaseBlock(slots []int64) {
	if err := d.m.primary.UnpinSoft(slots); err != nil {
		d.m.log.Error("tiering: cannot unpin a revoked cascade block", "slot", slots[0], "err", err)
	}
}

// PromotionDone commits the loaded keys and releases the rest.
func (d primaryDriver) PromotionDone(j *offload.Job, loaded []offload.Key) {
	p := d.m.primary
	if len(loaded) == len(j.Keys) {
		p.CompleteStore(j.Keys, true)
		return
	}
	if len(loaded) > 0 {
		p.CompleteStore(loaded, true)
	}
	failed := make([]offload.Key, 0, len(j.Keys)-len(loaded))
	i := 0
	for _, k := range j.Keys {
		if i < len(loaded) && loaded[i] == k {
			i++
			continue
		}
		failed = append(failed, k)
	}
	p.CompleteStore(failed, false)
}

// Tiers returns the secondary tiers in lookup order.
func (m *Manager) Tiers() []offload.SecondaryTier { return m.stack.Tiers() }

// Stack returns the manager's secondary-tier stack.
func (m *Manager) Stack() *Stack { return m.stack }

func (m *Manager) ctx(req *offload.ReqContext) *offload.ReqContext {
	if req == nil {
		return m.bg
	}
	return req
}

// OnNewRequest registers a request and asks every secondary tier how it
// wants the request's blocks offered. It returns RequestLevel when a tier
// that the request's store filter allows asked for it: a request-level
// tier the request may not store to gains nothing from prefix hits being
// offered again.
func (m *Manager) OnNewRequest(req *offload.ReqContext) offload.OffloadPolicy {
	req = m.ctx(req)
	if m.closed {
		return offload.BlockLevel
	}
	if rs, ok := m.reqs[req.ID]; ok {
		m.log.Warn("tiering: request announced twice; keeping its state", "req", req.ID)
		return rs.policy
	}
	rs := &reqState{req: req, requestLevel: m.stack.OnNewRequest(req)}
	if rs.requestLevel != 0 {
		rs.policy = offload.RequestLevel
	}
	m.reqs[req.ID] = rs
	return rs.policy
}

// OnRequestFinished marks the request finished. Its secondary tiers are
// told once its last pending store has completed (§4.7), so that they see
// every cascade of the request before its end.
func (m *Manager) OnRequestFinished(req *offload.ReqContext) {
	req = m.ctx(req)
	rs, ok := m.reqs[req.ID]
	if !ok {
		m.log.Debug("tiering: finish of an unknown request", "req", req.ID)
		return
	}
	rs.finished = true
	m.maybeFinalize(rs)
}

func (m *Manager) maybeFinalize(rs *reqState) {
	if !rs.finished || rs.pendingStores > 0 {
		return
	}
	m.stack.OnRequestFinished(rs.req)
	delete(m.reqs, rs.req.ID)
}

// PrimaryName is what Source answers for a block ready in the primary.
const PrimaryName = "primary"

// Source names where key's block is coming from, for tools: PrimaryName
// when it is ready in the primary, the secondary tier a promotion of it
// is loading it from, or "" (absent, or pending for another reason). It
// does not count as a lookup. It scans the step's promotions and the jobs
// in flight: not for the hot path.
func (m *Manager) Source(key offload.Key) string {
	if ref, ok := m.primary.RefCount(key); ok && ref >= 0 {
		return PrimaryName
	}
	for i := range m.promos {
		q := &m.promos[i]
		for _, b := range q.batches[:q.n] {
			if slices.Contains(b.keys, key) {
				return m.stack.tiers[i].name
			}
		}
	}
	name, _ := m.stack.PromotionSource(key)
	return name
}

// Lookup answers whether key can be loaded for req (§4.3). The primary is
// asked first and is never filtered; then each secondary tier the
// request's load filter allows, in order; a tier the filter excludes is
// not called. The first secondary Hit reserves a primary slot and queues a
// promotion, answering Retry (or HitPending, see Config); a full primary
// answers Miss.
func (m *Manager) Lookup(key offload.Key, req *offload.ReqContext) offload.LookupResult {
	if !m.polled {
		if m.closed {
			return offload.Miss
		}
		m.poll()
	}
	if r := m.primary.Lookup(key); r == offload.Hit || r == offload.HitPending {
		return r
	}
	return m.lookupSecondary(key, m.ctx(req))
}

// LookupPrefix looks keys up in order like the connector's prefix scan
// (§7.G): Hit counts; HitPending counts but defers; Retry stops the count
// but the scan continues so that later keys start their checks and
// promotions; the first Miss stops the scan. out, when long enough,
// receives each key's answer (Miss for keys not scanned). It returns the
// number of consecutive hits from the first key.
//
// A promotion started for a later key may evict a block that answered Hit
// earlier in the same scan; such a key is reported Retry instead (and the
// count ends before it), so that every key counted as a hit is present
// when LookupPrefix returns.
func (m *Manager) LookupPrefix(keys []offload.Key, req *offload.ReqContext, out []offload.LookupResult) (hits int) {
	if !m.polled {
		if m.closed {
			clear(out)
			return 0
		}
		m.poll()
	}
	req = m.ctx(req)
	started := m.promotions
	counting := true
	scanned := len(keys)
	for i, k := range keys {
		r := m.primary.Lookup(k)
		if r != offload.Hit && r != offload.HitPending {
			r = m.lookupSecondary(k, req)
		}
		if i < len(out) {
			out[i] = r
		}
		if r == offload.Hit || r == offload.HitPending {
			if counting {
				hits++
			}
			continue
		}
		if r == offload.Retry {
			counting = false
			continue
		}
		scanned = i + 1
		if scanned < len(out) {
			clear(out[scanned:])
		}
		break
	}
	if m.promotions != started {
		hits = m.recheckHits(keys[:scanned], out, hits)
	}
	return hits
}

// recheckHits demotes to Retry the keys of a scan that answered Hit but
// were evicted since by a promotion of the same scan, and returns the
// corrected hit count.
func (m *Manager) recheckHits(keys []offload.Key, out []offload.LookupResult, hits int) int {
	for i, k := range keys {
		if i < len(out) && out[i] != offload.Hit {
			continue
		}
		if i >= len(out) && i >= hits {
			break
		}
		ref, present := m.primary.RefCount(k)
		switch {
		case present && ref >= 0:
			continue
		case present: // evicted, then reserved again by this scan
			if i < len(out) {
				out[i] = offload.HitPending
			}
			continue
		}
		if i < len(out) {
			out[i] = offload.Retry
		}
		hits = min(hits, i)
	}
	return hits
}

func (m *Manager) lookupSecondary(key offload.Key, req *offload.ReqContext) offload.LookupResult {
	r, i := m.stack.Lookup(key, req)
	if r == offload.Hit {
		return m.promote(i, key, req)
	}
	return r
}

// promote reserves a primary slot for key and queues its load from ts in
// this step's batch for (ts, req) (§4.4).
func (m *Manager) promote(i int, key offload.Key, req *offload.ReqContext) offload.LookupResult {
	ts := m.stack.tiers[i]
	m.one[0] = key
	out := &m.promoOut
	// Queued cascades give way (Stack.Revoke): promotions are never
	// refused because of cascades.
	ok := m.primary.PrepareStoreInto(m.one[:], out)
	m.one[0] = ""
	if !ok {
		ts.stats.PromotionsRejected++
		return offload.Miss
	}
	if len(out.KeysToStore) == 0 {
		// Present after all (cannot happen after a primary Miss).
		return offload.HitPending
	}
	b := m.promos[i].batch(req)
	b.keys = append(b.keys, out.KeysToStore...)
	b.slots = append(b.slots, out.Slots...)
	m.pendingPromos += len(out.KeysToStore)
	clear(out.KeysToStore) // the scratch must not keep keys alive
	clear(out.Evicted)
	m.promotions++
	ts.stats.PromotionsStarted++
	if m.hitPending {
		return offload.HitPending
	}
	return offload.Retry
}

// batch returns this step's promotion batch of req, creating it. The
// batch keeps the first context seen for the request in the step.
func (q *promoQueue) batch(req *offload.ReqContext) *promoBatch {
	for i := range q.batches[:q.n] {
		if b := &q.batches[i]; b.req == req || b.req.ID == req.ID {
			return b
		}
	}
	if q.n == len(q.batches) {
		q.batches = append(q.batches, promoBatch{})
	}
	b := &q.batches[q.n]
	q.n++
	b.req = req
	return b
}

// PrepareLoad pins keys in the primary for a load to the engine; keys must
// be Hit there. Slots are co-indexed with keys.
func (m *Manager) PrepareLoad(keys []offload.Key, req *offload.ReqContext) ([]int64, error) {
	if m.closed {
		return nil, ErrClosed
	}
	slots, err := m.primary.PrepareLoad(keys)
	if err != nil {
		return nil, fmt.Errorf("tiering: prepare load for request %q: %w", m.ctx(req).ID, err)
	}
	return slots, nil
}

// PrepareLoadPresent pins the keys still readable in the primary and
// answers slot -1 for the others (evicted or rewritten since the lookup
// that answered Hit); missing counts them. See cpu.Primary.PrepareLoadPresent.
func (m *Manager) PrepareLoadPresent(keys []offload.Key) (slots []int64, missing int, err error) {
	if m.closed {
		return nil, 0, ErrClosed
	}
	slots, missing = m.primary.PrepareLoadPresent(keys)
	return slots, missing, nil
}

// SlotGen returns how many blocks the primary's slot has been given
// (cpu.Primary.SlotGen): what a reader that derived something from a
// block's bytes keys it by.
func (m *Manager) SlotGen(slot int64) uint16 { return m.primary.SlotGen(slot) }

// Touch refreshes recency in the primary and in every secondary tier (not
// filtered: recency is not a load).
func (m *Manager) Touch(keys []offload.Key, req *offload.ReqContext) {
	if m.closed {
		return
	}
	req = m.ctx(req)
	m.primary.Touch(keys)
	m.stack.Touch(keys, req)
}

// CompleteLoad unpins keys pinned by PrepareLoad.
func (m *Manager) CompleteLoad(keys []offload.Key, req *offload.ReqContext) error {
	if m.closed {
		return ErrClosed
	}
	if err := m.primary.CompleteLoad(keys); err != nil {
		return fmt.Errorf("tiering: complete load for request %q: %w", m.ctx(req).ID, err)
	}
	return nil
}

// PrepareStore reserves primary slots for the keys not yet stored (§4.6).
// ok is false when the primary cannot make room (nothing changed). For a
// request with request-level tiers, keys already ready in the primary are
// cascaded to those tiers at once. The output's slices are new and belong
// to the caller.
func (m *Manager) PrepareStore(keys []offload.Key, req *offload.ReqContext) (offload.PrepareStoreOutput, bool, error) {
	var out offload.PrepareStoreOutput
	ok, err := m.prepareStore(keys, req, &out, false)
	if !ok {
		out = offload.PrepareStoreOutput{}
	}
	return out, ok, err
}

// PrepareStoreInto is PrepareStore writing its output into out like
// cpu.Primary.PrepareStoreInto: out's slices are reused when large enough,
// so a caller that encodes the output and keeps one PrepareStoreOutput for
// the next call stores without allocating. On !ok or an error out's
// slices are empty.
func (m *Manager) PrepareStoreInto(keys []offload.Key, req *offload.ReqContext, out *offload.PrepareStoreOutput) (bool, error) {
	out.KeysToStore, out.Slots, out.Evicted = out.KeysToStore[:0], out.Slots[:0], out.Evicted[:0]
	return m.prepareStore(keys, req, out, true)
}

func (m *Manager) prepareStore(keys []offload.Key, req *offload.ReqContext, out *offload.PrepareStoreOutput, reuse bool) (bool, error) {
	if m.closed {
		return false, ErrClosed
	}
	req = m.ctx(req)
	rs, ok := m.reqs[req.ID]
	if !ok {
		return false, fmt.Errorf("%w %q: prepare store", ErrUnknownRequest, req.ID)
	}
	if rs.finished {
		return false, fmt.Errorf("%w: %q: prepare store", ErrRequestFinished, req.ID)
	}
	if !m.polled {
		m.poll() // completions free pinned blocks before eviction decisions
	}
	// Stores win over queued cascades: eviction withdraws those of the
	// blocks it takes (Stack.Revoke).
	if ok = m.primaryStore(keys, out, reuse); !ok {
		return false, nil
	}
	rs.pendingStores += len(out.KeysToStore)
	if rs.requestLevel != 0 {
		if existing := m.readyNotStored(keys, out.KeysToStore); len(existing) > 0 {
			m.stack.Cascade(existing, req, rs.requestLevel)
		}
	}
	return true, nil
}

func (m *Manager) primaryStore(keys []offload.Key, out *offload.PrepareStoreOutput, reuse bool) (ok bool) {
	if reuse {
		return m.primary.PrepareStoreInto(keys, out)
	}
	*out, ok = m.primary.PrepareStore(keys)
	return ok
}

// readyNotStored returns the keys that PrepareStore did not take (they
// were present) and that are ready in the primary.
func (m *Manager) readyNotStored(keys, toStore []offload.Key) []offload.Key {
	var out []offload.Key
	j := 0
	for _, k := range keys {
		if j < len(toStore) && toStore[j] == k {
			j++ // keys_to_store is keys filtered in order
			continue
		}
		if m.ready(k) {
			out = append(out, k)
		}
	}
	return out
}

// ready reports whether k is ready (readable) in the primary, without
// counting as a lookup in its metrics.
func (m *Manager) ready(k offload.Key) bool {
	ref, ok := m.primary.RefCount(k)
	return ok && ref >= 0
}

// CompleteStore commits (success) or releases the slots reserved by
// PrepareStore. On success the keys are cascaded to every secondary tier
// the request's store filter allows and that is not under back-pressure; a
// failed store cascades nowhere. The slots are resolved even when the
// request is unknown (then nothing is cascaded and ErrUnknownRequest is
// returned).
func (m *Manager) CompleteStore(keys []offload.Key, req *offload.ReqContext, success bool) error {
	if m.closed {
		return ErrClosed
	}
	req = m.ctx(req)
	resolved := m.primary.CompleteStore(keys, success)
	rs, ok := m.reqs[req.ID]
	if !ok {
		return fmt.Errorf("%w %q: complete store", ErrUnknownRequest, req.ID)
	}
	if success && len(keys) > 0 && m.stack.Len() > 0 {
		m.stack.Cascade(slices.Clone(keys), req, ^uint64(0))
	}
	// Counted in keys, not calls: a client may complete a reservation in
	// parts, or abandon several PrepareStores with one call (a session's
	// release does), and the request must finalize exactly when its last
	// reserved slot is resolved.
	rs.pendingStores -= min(resolved, rs.pendingStores)
	m.maybeFinalize(rs)
	return nil
}

// Lease reserves up to n primary slots for an engine that assigns its
// store slots itself (vLLM manager mode): see cpu.Primary.Lease. Finished
// jobs are polled first, so that their pins do not keep blocks from being
// evicted for the lease.
func (m *Manager) Lease(n int) (slots []int64, evicted []offload.Key, err error) {
	if m.closed {
		return nil, nil, ErrClosed
	}
	if !m.polled {
		m.poll()
	}
	slots, evicted = m.primary.Lease(n)
	return slots, evicted, nil
}

// Bind commits an engine's stores into its leased slots: with success,
// each slots[i] becomes keys[i]'s ready block (a copy of a key already
// present is dropped and its slot freed) and the blocks bound cascade to
// the secondary tiers the request's store filter allows, as CompleteStore
// cascades; without success the slots go back to the free list. It
// returns the number of blocks bound.
func (m *Manager) Bind(keys []offload.Key, slots []int64, req *offload.ReqContext, success bool) (int, error) {
	if m.closed {
		return 0, ErrClosed
	}
	if len(keys) != len(slots) {
		return 0, fmt.Errorf("tiering: bind %d keys to %d slots", len(keys), len(slots))
	}
	for _, s := range slots {
		if !m.primary.Leased(s) {
			return 0, fmt.Errorf("tiering: bind: slot %d: %w", s, cpu.ErrNotLeased)
		}
	}
	if !success {
		return 0, m.primary.Unlease(slots)
	}
	if !m.polled {
		// Finished cascades release their pins first, so that the
		// budget admits this batch's cascade against the cascades still
		// in flight, not against ones that ended since the last step (an
		// engine that stores in bursts, as SGLang's backup thread does,
		// would see every other burst dropped).
		m.poll()
	}
	req = m.ctx(req)
	var bound []offload.Key
	for i, s := range slots {
		ok, err := m.primary.Bind(s, keys[i])
		if err != nil {
			// Checked above: cannot happen; the slots left stay leased.
			return len(bound), err
		}
		if ok {
			bound = append(bound, keys[i])
		}
	}
	if len(bound) > 0 && m.stack.Len() > 0 {
		m.stack.Cascade(bound, req, ^uint64(0))
	}
	return len(bound), nil
}

// Unlease gives leased slots back (cpu.Primary.Unlease).
func (m *Manager) Unlease(slots []int64) error {
	if m.closed {
		return ErrClosed
	}
	return m.primary.Unlease(slots)
}

func (m *Manager) readyKeys(keys []offload.Key) []offload.Key {
	var out []offload.Key
	for _, k := range keys {
		if m.ready(k) {
			out = append(out, k)
		}
	}
	return out
}

// ScheduleEnd ends an engine step (§4.8): poll completions if this step
// has not, reset the gate, submit the step's promotions, then let every
// tier end its step.
func (m *Manager) ScheduleEnd(se offload.ScheduleEnd) {
	if m.closed {
		return
	}
	if !m.polled {
		m.poll()
	}
	m.polled = false
	m.flushPromotions()
	m.stack.ScheduleEnd(se)
}

// flushPromotions submits one load job per (tier, request) batch.
func (m *Manager) flushPromotions() {
	if m.pendingPromos == 0 {
		return
	}
	for i := range m.promos {
		q := &m.promos[i]
		for j := range q.batches[:q.n] {
			b := &q.batches[j]
			m.stack.Load(i, b.keys, b.slots, b.req)
			*b = promoBatch{}
		}
		q.n = 0
	}
	m.pendingPromos = 0
}

// dropPromotions forgets the step's unsubmitted promotions; release
// frees their reserved slots.
func (m *Manager) dropPromotions(release bool) {
	for i := range m.promos {
		q := &m.promos[i]
		for j := range q.batches[:q.n] {
			b := &q.batches[j]
			if release {
				m.primary.CompleteStore(b.keys, false)
			}
			*b = promoBatch{}
		}
		q.n = 0
	}
	m.pendingPromos = 0
}

// poll passes the step's completion gate and processes finished jobs.
func (m *Manager) poll() {
	m.polled = true
	m.stack.Poll()
}

// HasPendingWork reports jobs in flight, promotions not yet submitted, or
// tier work in flight: the engine must keep stepping.
func (m *Manager) HasPendingWork() bool {
	if m.pendingPromos > 0 {
		return true
	}
	if m.closed {
		return m.stack.InFlight() > 0
	}
	return m.stack.HasPendingWork()
}

// TakeEvents returns the primary's events, then each tier's in order. The
// manager never makes events up for a tier.
func (m *Manager) TakeEvents() []offload.Event {
	if m.closed {
		return nil
	}
	return m.stack.TakeEvents(m.primary.TakeEvents())
}

// Reset empties the primary (§4.9) of every block no one holds: it waits
// (bounded by ctx) until no tier transfer touches primary memory,
// processes the finished jobs, drops unsubmitted promotions and resets the
// primary, which keeps the blocks the engine still reads or writes, and
// the requests their pending stores. Secondary tiers keep their data. If
// a tier cannot be drained, nothing is reset and the error says which.
func (m *Manager) Reset(ctx context.Context) error {
	if m.closed {
		return ErrClosed
	}
	if err := m.stack.Drain(ctx); err != nil {
		return fmt.Errorf("tiering: reset: %w", err)
	}
	m.stack.Poll()
	m.dropPromotions(true)
	m.stack.Forget()
	// The engine's own stores and loads stay valid: the primary keeps the
	// blocks they hold (cpu.Primary.Reset).
	m.primary.Reset()
	m.polled = false
	return nil
}

// Close shuts the manager down: unsubmitted promotions are released, every
// tier is closed (answering its outstanding jobs), their results are
// applied, jobs a tier failed to answer are failed, and the primary is
// closed. If a tier cannot be closed within ctx its transfers may still
// touch the primary's memory, so the primary is then left open and the
// error says so.
func (m *Manager) Close(ctx context.Context) error {
	if m.closed {
		return nil
	}
	m.stack.Poll()
	m.dropPromotions(true)
	err := m.stack.Close(ctx)
	m.closed = true
	m.polled = false // the hot paths test closed only behind the gate
	clear(m.reqs)
	if err != nil {
		return errors.Join(err, errors.New("tiering: primary left open: tier transfers may still be running"))
	}
	if err := m.primary.Close(); err != nil {
		return fmt.Errorf("tiering: close primary: %w", err)
	}
	return nil
}
