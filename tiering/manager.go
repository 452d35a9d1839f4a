package tiering

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

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
}

// Manager is the tiering manager. It is not safe for concurrent use.
type Manager struct {
	primary    *cpu.Primary
	arena      offload.Arena
	tiers      []*tier
	log        *slog.Logger
	hitPending bool
	adm        AdmissionConfig
	bg         *offload.ReqContext // stands in for a nil request context

	// polled is the once-per-step completion gate (§4.2).
	polled bool
	// nextID is the job id counter shared by promotions and cascades.
	nextID uint64
	// resetFloor is the first job id issued after the last Reset; results
	// for unknown older ids are stale, not tier bugs.
	resetFloor uint64
	jobs       map[uint64]*job
	// pendingPromos counts keys reserved for promotion and not yet
	// submitted.
	pendingPromos int
	// promotions counts promotions started (slots reserved).
	promotions   uint64
	reqs         map[string]*reqState
	staleResults uint64
	closed       bool
	// finishedAt is the time processFinished collected the results it is
	// applying (zero until first needed, and outside processFinished).
	finishedAt time.Time
	// epoch is the manager's creation time, the origin of job start times.
	epoch time.Time

	one      [1]offload.Key             // scratch for single-key primary calls
	promoOut offload.PrepareStoreOutput // scratch output of a promotion's reservation
}

// tier is the manager's view of one secondary tier.
type tier struct {
	t        offload.SecondaryTier
	idx      int
	name     string
	typ      string
	medium   offload.Medium
	locality offload.Locality

	// promos are this step's promotions, one batch per request in the
	// order requests first hit this tier; npromos of them are in use.
	promos  []promoBatch
	npromos int

	cascadesInFlight int
	pressure         pressure
	stats            TierStats
}

type promoBatch struct {
	req   *offload.ReqContext
	keys  []offload.Key
	slots []int64
}

// job is one submitted transfer.
type job struct {
	tier  *tier
	start time.Duration // submission time, since the manager's epoch (8 bytes, not 24)
	j     offload.Job
}

// reqState is the manager's per-request lifecycle state (§4.7).
type reqState struct {
	req           *offload.ReqContext
	policy        offload.OffloadPolicy
	pendingStores int
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
	if len(cfg.Tiers) > MaxTiers {
		return nil, fmt.Errorf("tiering: %d secondary tiers: at most %d supported", len(cfg.Tiers), MaxTiers)
	}
	adm, err := cfg.Admission.withDefaults()
	if err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m := &Manager{
		primary:    cfg.Primary,
		arena:      cfg.Primary.Arena(),
		log:        log,
		hitPending: cfg.HitPendingOnPromotion,
		adm:        adm,
		bg:         offload.Background(""),
		epoch:      time.Now(),
		jobs:       make(map[uint64]*job),
		reqs:       make(map[string]*reqState),
	}
	names := make(map[string]bool, len(cfg.Tiers))
	for i, t := range cfg.Tiers {
		if t == nil {
			return nil, fmt.Errorf("tiering: secondary tier #%d is nil", i)
		}
		ts := &tier{t: t, idx: i}
		// A tier's declarations are read once, here: the lookup loop then
		// tests the request's filter without calling into the tier.
		if err := m.describe(ts); err != nil {
			return nil, err
		}
		if names[ts.name] {
			return nil, fmt.Errorf("tiering: duplicate secondary tier name %q", ts.name)
		}
		names[ts.name] = true
		ts.stats.Name, ts.stats.Type = ts.name, ts.typ
		ts.stats.Medium, ts.stats.Locality = ts.medium, ts.locality
		m.tiers = append(m.tiers, ts)
	}
	return m, nil
}

// describe reads a tier's static declarations, failing construction if
// the tier panics.
func (m *Manager) describe(ts *tier) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("tiering: secondary tier #%d: describing it panicked: %v", ts.idx, p)
		}
	}()
	ts.name, ts.typ = ts.t.Name(), ts.t.Type()
	ts.medium, ts.locality = ts.t.Medium(), ts.t.Locality()
	return nil
}

// Tiers returns the secondary tiers in lookup order.
func (m *Manager) Tiers() []offload.SecondaryTier {
	out := make([]offload.SecondaryTier, len(m.tiers))
	for i, ts := range m.tiers {
		out[i] = ts.t
	}
	return out
}

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
	rs := &reqState{req: req}
	for _, ts := range m.tiers {
		if m.tierOnNewRequest(ts, req) == offload.RequestLevel && req.StoreFilter.Allows(ts.medium, ts.locality) {
			rs.requestLevel |= 1 << ts.idx
		}
	}
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
	for _, ts := range m.tiers {
		m.tierOnRequestFinished(ts, rs.req)
	}
	delete(m.reqs, rs.req.ID)
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
	filter := req.LoadFilter
	retry := false
	for _, ts := range m.tiers {
		if !filter.Allows(ts.medium, ts.locality) {
			ts.stats.SkippedByFilter++
			continue
		}
		switch m.tierLookup(ts, key, req) {
		case offload.Hit:
			ts.stats.Hits++
			return m.promote(ts, key, req)
		case offload.Retry, offload.HitPending:
			// A tier has no pending state of its own to report; treat
			// HitPending as "not sure yet".
			ts.stats.Retries++
			retry = true
		default:
			ts.stats.Misses++
		}
	}
	if retry {
		return offload.Retry
	}
	return offload.Miss
}

// promote reserves a primary slot for key and queues its load from ts in
// this step's batch for (ts, req) (§4.4).
func (m *Manager) promote(ts *tier, key offload.Key, req *offload.ReqContext) offload.LookupResult {
	m.one[0] = key
	out := &m.promoOut
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
	b := ts.batch(req)
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

// batch returns this step's promotion batch of req on ts, creating it. The
// batch keeps the first context seen for the request in the step.
func (ts *tier) batch(req *offload.ReqContext) *promoBatch {
	for i := range ts.promos[:ts.npromos] {
		if b := &ts.promos[i]; b.req == req || b.req.ID == req.ID {
			return b
		}
	}
	if ts.npromos == len(ts.promos) {
		ts.promos = append(ts.promos, promoBatch{})
	}
	b := &ts.promos[ts.npromos]
	ts.npromos++
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

// Touch refreshes recency in the primary and in every secondary tier (not
// filtered: recency is not a load).
func (m *Manager) Touch(keys []offload.Key, req *offload.ReqContext) {
	if m.closed {
		return
	}
	req = m.ctx(req)
	m.primary.Touch(keys)
	for _, ts := range m.tiers {
		m.tierTouch(ts, keys, req)
	}
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
	if reuse {
		ok = m.primary.PrepareStoreInto(keys, out)
	} else {
		*out, ok = m.primary.PrepareStore(keys)
	}
	if !ok {
		return false, nil
	}
	if len(out.KeysToStore) > 0 {
		rs.pendingStores++
	}
	if rs.requestLevel != 0 {
		if existing := m.readyNotStored(keys, out.KeysToStore); len(existing) > 0 {
			m.cascade(existing, req, rs.requestLevel)
		}
	}
	return true, nil
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
	m.primary.CompleteStore(keys, success)
	rs, ok := m.reqs[req.ID]
	if !ok {
		return fmt.Errorf("%w %q: complete store", ErrUnknownRequest, req.ID)
	}
	if success && len(keys) > 0 && len(m.tiers) > 0 {
		m.cascade(slices.Clone(keys), req, ^uint64(0))
	}
	if rs.pendingStores > 0 {
		rs.pendingStores--
	} else {
		// Legal after a Reset zeroed the count while the store was in
		// flight.
		m.log.Debug("tiering: complete store without a pending store", "req", req.ID)
	}
	m.maybeFinalize(rs)
	return nil
}

// cascade submits a store of keys (owned by the jobs from now on) to every
// tier in mask that req's store filter allows and admission accepts,
// pinning the keys once per job. Only the first job looks the keys up
// (PrepareLoad, which finds a batch just stored without hashing); the
// others pin the same slots by index. The jobs share keys and slots,
// which tiers only read.
func (m *Manager) cascade(keys []offload.Key, req *offload.ReqContext, mask uint64) {
	filter := req.StoreFilter
	var now time.Time
	var slots []int64
	var block []job // the cascade's jobs, one allocation
	for _, ts := range m.tiers {
		if mask&(1<<ts.idx) == 0 {
			continue
		}
		if !filter.Allows(ts.medium, ts.locality) {
			ts.stats.CascadesSkippedByFilter++
			continue
		}
		if !m.adm.Disabled && ts.pressure.active && ts.cascadesInFlight > 0 {
			ts.stats.CascadesDropped++
			ts.stats.CascadeBlocksDropped += uint64(len(keys))
			continue
		}
		if slots != nil {
			// The blocks are pinned by the first job, so the slots still
			// name them.
			if err := m.primary.PinSlots(slots); err != nil {
				m.log.Error("tiering: cannot pin cascade source blocks", "tier", ts.name, "req", req.ID, "err", err)
				ts.stats.CascadesFailed++
				continue
			}
		} else {
			var err error
			if slots, err = m.primary.PrepareLoad(keys); err != nil {
				// Some key is no longer ready (evicted or re-reserved
				// since the caller saw it); cascade the ones that are.
				keys = m.readyKeys(keys)
				if len(keys) == 0 {
					return
				}
				if slots, err = m.primary.PrepareLoad(keys); err != nil {
					m.log.Error("tiering: cannot pin cascade source blocks", "tier", ts.name, "req", req.ID, "err", err)
					ts.stats.CascadesFailed++
					slots = nil
					continue
				}
			}
		}
		if now.IsZero() {
			now = time.Now()
			block = make([]job, 0, len(m.tiers)-ts.idx)
		}
		block = block[:len(block)+1] // within capacity: one job per tier left
		jb := m.initJob(&block[len(block)-1], ts, keys, slots, false, req, now)
		ts.cascadesInFlight++
		if !m.tierSubmit(ts, &jb.j) {
			m.failSubmitted(jb, "submit store panicked")
		}
	}
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

func (m *Manager) newJob(ts *tier, keys []offload.Key, slots []int64, promotion bool, req *offload.ReqContext, now time.Time) *job {
	return m.initJob(new(job), ts, keys, slots, promotion, req, now)
}

// initJob fills jb as a new job and registers it.
func (m *Manager) initJob(jb *job, ts *tier, keys []offload.Key, slots []int64, promotion bool, req *offload.ReqContext, now time.Time) *job {
	id := m.nextID
	m.nextID++
	*jb = job{tier: ts, start: now.Sub(m.epoch), j: offload.Job{ID: id, Keys: keys, Slots: slots, Promotion: promotion, Req: req, Arena: m.arena}}
	m.jobs[id] = jb
	return jb
}

// failSubmitted resolves a job whose submission panicked: the tier is
// assumed not to have taken it.
func (m *Manager) failSubmitted(jb *job, why string) {
	if _, ok := m.jobs[jb.j.ID]; !ok {
		return
	}
	delete(m.jobs, jb.j.ID)
	m.finishJob(jb, offload.JobResult{JobID: jb.j.ID, Err: errors.New(why)})
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
	for _, ts := range m.tiers {
		m.tierScheduleEnd(ts, se)
	}
}

// flushPromotions submits one load job per (tier, request) batch.
func (m *Manager) flushPromotions() {
	if m.pendingPromos == 0 {
		return
	}
	now := time.Now()
	for _, ts := range m.tiers {
		for i := range ts.promos[:ts.npromos] {
			b := &ts.promos[i]
			jb := m.newJob(ts, b.keys, b.slots, true, b.req, now)
			*b = promoBatch{}
			if !m.tierSubmit(ts, &jb.j) {
				m.failSubmitted(jb, "submit load panicked")
			}
		}
		ts.npromos = 0
	}
	m.pendingPromos = 0
}

// dropPromotions forgets the step's unsubmitted promotions; release
// frees their reserved slots (not needed before a primary reset).
func (m *Manager) dropPromotions(release bool) {
	for _, ts := range m.tiers {
		for i := range ts.promos[:ts.npromos] {
			b := &ts.promos[i]
			if release {
				m.primary.CompleteStore(b.keys, false)
			}
			*b = promoBatch{}
		}
		ts.npromos = 0
	}
	m.pendingPromos = 0
}

// poll passes the step's completion gate and processes finished jobs.
func (m *Manager) poll() {
	m.polled = true
	m.processFinished()
}

// processFinished collects every tier's results, in tier order.
func (m *Manager) processFinished() {
	// The results were all collected now: one clock read dates them.
	m.finishedAt = time.Time{}
	defer func() { m.finishedAt = time.Time{} }()
	for _, ts := range m.tiers {
		for _, r := range m.tierFinished(ts) {
			jb, ok := m.jobs[r.JobID]
			if !ok || jb.tier != ts {
				if !ok && r.JobID < m.resetFloor {
					m.staleResults++
					continue
				}
				ts.stats.UnknownJobs++
				m.log.Error("tiering: tier reported a job it was not given", "tier", ts.name, "job", r.JobID)
				continue
			}
			delete(m.jobs, r.JobID)
			m.finishJob(jb, r)
		}
	}
}

// finishJob applies a job's result: a promotion commits its loaded prefix
// and releases the rest; a cascade unpins its sources.
func (m *Manager) finishJob(jb *job, r offload.JobResult) {
	ts := jb.tier
	keys := jb.j.Keys
	if jb.j.Promotion {
		if r.Success {
			m.primary.CompleteStore(keys, true)
			ts.stats.PromotionsOK++
			ts.stats.PromotedBlocks += uint64(len(keys))
			ts.stats.BytesIn += uint64(max(r.Bytes, 0))
			return
		}
		n := 0
		for n < len(r.SuccessfulKeys) && n < len(keys) && r.SuccessfulKeys[n] == keys[n] {
			n++
		}
		if n > 0 {
			m.primary.CompleteStore(keys[:n], true)
		}
		m.primary.CompleteStore(keys[n:], false)
		ts.stats.PromotionsFailed++
		ts.stats.PromotedBlocks += uint64(n)
		ts.stats.PromotionBlocksFailed += uint64(len(keys) - n)
		ts.stats.BytesIn += uint64(max(r.Bytes, 0))
		m.log.Debug("tiering: promotion failed", "tier", ts.name, "job", r.JobID, "keys", len(keys), "loaded", n, "err", r.Err)
		return
	}
	ts.cascadesInFlight--
	if err := m.primary.UnpinSlots(jb.j.Slots); err != nil {
		m.log.Error("tiering: cannot unpin cascade source blocks", "tier", ts.name, "job", r.JobID, "err", err)
	}
	if !r.Success {
		ts.stats.CascadesFailed++
		m.log.Debug("tiering: cascade failed", "tier", ts.name, "job", r.JobID, "err", r.Err)
		return
	}
	ts.stats.CascadesOK++
	ts.stats.CascadedBlocks += uint64(len(keys))
	ts.stats.BytesOut += uint64(max(r.Bytes, 0))
	if m.adm.Disabled {
		return
	}
	d := r.Duration
	if d <= 0 {
		if m.finishedAt.IsZero() {
			m.finishedAt = time.Now()
		}
		d = m.finishedAt.Sub(m.epoch) - jb.start
	}
	if ts.pressure.sample(d, &m.adm) {
		state := "cleared"
		if ts.pressure.active {
			state = "activated"
		}
		m.log.Info("tiering: tier back-pressure "+state, "tier", ts.name, "index", ts.idx,
			"ema", time.Duration(ts.pressure.ema*float64(time.Second)))
	}
}

// HasPendingWork reports jobs in flight, promotions not yet submitted, or
// tier work in flight: the engine must keep stepping.
func (m *Manager) HasPendingWork() bool {
	if len(m.jobs) > 0 || m.pendingPromos > 0 {
		return true
	}
	if m.closed {
		return false
	}
	for _, ts := range m.tiers {
		if m.tierHasPendingWork(ts) {
			return true
		}
	}
	return false
}

// TakeEvents returns the primary's events, then each tier's in order. The
// manager never makes events up for a tier.
func (m *Manager) TakeEvents() []offload.Event {
	if m.closed {
		return nil
	}
	ev := m.primary.TakeEvents()
	for _, ts := range m.tiers {
		ev = append(ev, m.tierTakeEvents(ts)...)
	}
	return ev
}

// Reset empties the primary (§4.9): it waits (bounded by ctx) until no
// tier transfer touches primary memory, processes the finished jobs,
// drops unsubmitted promotions, finalises finished requests (active ones
// are kept with no pending stores) and resets the primary. Secondary tiers
// keep their data. If a tier cannot be drained, nothing is reset and the
// error says which tier.
func (m *Manager) Reset(ctx context.Context) error {
	if m.closed {
		return ErrClosed
	}
	for _, ts := range m.tiers {
		if err := m.tierDrain(ctx, ts); err != nil {
			return fmt.Errorf("tiering: reset: drain tier %q: %w", ts.name, err)
		}
	}
	m.processFinished()
	m.dropPromotions(false)
	if len(m.jobs) > 0 {
		// The tiers said they were drained but did not answer these; they
		// are forgotten and their late results ignored.
		m.log.Error("tiering: reset: jobs unanswered after drain", "jobs", len(m.jobs))
		for _, jb := range m.jobs {
			if !jb.j.Promotion {
				jb.tier.cascadesInFlight--
			}
		}
		clear(m.jobs)
	}
	m.resetFloor = m.nextID
	for _, rs := range m.reqs {
		rs.pendingStores = 0
		m.maybeFinalize(rs)
	}
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
	m.processFinished()
	m.dropPromotions(true)
	var errs []error
	for _, ts := range m.tiers {
		if err := m.tierClose(ctx, ts); err != nil {
			errs = append(errs, fmt.Errorf("tiering: close tier %q: %w", ts.name, err))
		}
	}
	m.processFinished()
	for id, jb := range m.jobs {
		delete(m.jobs, id)
		m.finishJob(jb, offload.JobResult{JobID: id, Err: ErrClosed})
	}
	m.closed = true
	m.polled = false // the hot paths test closed only behind the gate
	clear(m.reqs)
	if len(errs) > 0 {
		errs = append(errs, errors.New("tiering: primary left open: tier transfers may still be running"))
		return errors.Join(errs...)
	}
	if err := m.primary.Close(); err != nil {
		return fmt.Errorf("tiering: close primary: %w", err)
	}
	return nil
}
