package tiering

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

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
	// Prefetch bounds prefetches (prefetch.go); the zero value means
	// defaults.
	Prefetch PrefetchConfig
	// Pins bounds routers' and agents' pins (pins.go); the zero value
	// means defaults.
	Pins PinConfig
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
	// prefetch holds the prefetches of routers and agents (prefetch.go).
	prefetch *prefetcher
	// pins holds their pins with a TTL (pins.go).
	pins *pinner

	one      [1]offload.Key             // scratch for single-key primary calls
	promoOut offload.PrepareStoreOutput // scratch output of a promotion's reservation
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
		Owners:    primaryOwners(cfg.Primary),
	})
	if err != nil {
		return nil, err
	}
	m.stack = st
	cfg.Primary.SetRevoker(st.Revoke)
	m.promos = make([]promoQueue, st.Len())
	m.prefetch = newPrefetcher(cfg.Prefetch, cfg.Primary.NumSlots())
	m.pins = newPinner(m, cfg.Pins)
	// Tiers that choose their own victims pass over pinned blocks.
	for _, t := range cfg.Tiers {
		if k, ok := t.(offload.Keeper); ok {
			k.Keep(m.pinnedNow)
		}
	}
	return m, nil
}

// primaryOwners divides the cascade pin budget like the primary's shares
// divide its slots: each tenant's cascades may pin its quota's share of
// the budget (the untagged pool what the quotas leave).
func primaryOwners(p *cpu.Primary) Owners {
	quotas := p.Quotas()
	if quotas == nil {
		return Owners{}
	}
	shares := make([]float64, len(quotas))
	for i, q := range quotas {
		shares[i] = float64(q) / float64(p.NumSlots())
	}
	return Owners{Of: p.OwnerOf, Shares: shares}
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
	// A prefetch's blocks are held once ready (prefetch.go).
	defer d.m.promotionLanded(j, loaded)
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
	m.expirePins()
	m.stepPrefetches()
	m.flushPromotions()
	m.stack.ScheduleEnd(se)
}

// poll passes the step's completion gate and processes finished jobs.
func (m *Manager) poll() {
	m.polled = true
	m.stack.Poll()
}

// HasPendingWork reports jobs in flight, promotions not yet submitted, or
// tier work in flight: the engine must keep stepping.
func (m *Manager) HasPendingWork() bool {
	if m.pendingPromos > 0 || len(m.prefetch.queue) > 0 {
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
	m.resetPrefetches()
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
	m.resetPrefetches()
	m.releasePins()
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
