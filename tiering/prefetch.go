// Prefetch: a router or an agent that knows a request is coming asks for
// its prefix ahead of it (issue 41). The leading run the load filter
// allows is promoted toward the primary as an engine's lookups would
// promote it, so that the engine's lookup in the step that asks answers
// Hit. A prefetch waits for tiers that check existence asynchronously,
// step by step, until its deadline; its promotions, once submitted, land
// whatever the deadline (no transfer is aborted midway).
//
// A prefetched block is held (one load pin) from its landing until a
// lookup finds it (the engine's, which then takes its own pin) or its
// prefetch's deadline passes: without the hold the next prefetch, or the
// engine's stores, would evict it before the request it was brought for
// reads it, and the engine would read it from its tier again. Holds give
// way to the engine: a store, lease or promotion of the engine's that
// finds no room releases them all first (yieldHolds), so a prefetch never
// costs the engine a slot.
//
// Bounds: the slots prefetch promotions hold, in flight and landed, never
// exceed a share of the primary (PrefetchConfig.Share), and at most
// MaxQueued prefetches wait at once. A promotion's reservation evicts only
// what any store may evict: never a pinned or leased block.

package tiering

import (
	"errors"
	"fmt"
	"time"

	"github.com/kvtier/kvtier/offload"
)

// ErrPrefetchRefused reports a prefetch the manager does not take: off by
// configuration, or too many waiting.
var ErrPrefetchRefused = errors.New("tiering: prefetch refused")

// PrefetchConfig bounds prefetches.
type PrefetchConfig struct {
	// Share is the share of the primary's slots that prefetch promotions
	// may hold in flight (0: DefaultPrefetchShare; negative: prefetch
	// off).
	Share float64
	// MaxQueued bounds the prefetches waiting at once (0:
	// DefaultPrefetchQueue).
	MaxQueued int
	// Now is the clock deadlines are read against (nil: time.Now).
	Now func() time.Time
}

// Defaults of PrefetchConfig.
const (
	DefaultPrefetchShare = 0.25
	DefaultPrefetchQueue = 1024
)

// PrefetchStats count prefetches: Started (accepted), Completed (their
// whole run resolved: present, or promoted), Expired (deadline passed
// first), Refused (not accepted), Promotions (blocks whose promotion a
// prefetch started); Queued and InFlight are gauges (prefetches waiting,
// slots their promotions hold, in flight or landed and not yet found).
type PrefetchStats struct {
	Started, Completed, Expired, Refused, Promotions uint64
	// Yielded counts landed blocks whose hold the engine's need for room
	// released before their request read them.
	Yielded          uint64
	Queued, InFlight int
}

// PrefetchAnswer is what a Prefetch call found at once: Present leading
// keys ready in the primary or already on their way, Started promotions
// it started, and whether the prefetch waits for more (Queued).
type PrefetchAnswer struct {
	Present, Started int
	Queued           bool
}

type prefetch struct {
	req      *offload.ReqContext
	keys     []offload.Key
	next     int // first key not resolved yet
	deadline time.Time
	inFlight int  // slots of its promotions not landed yet
	queued   bool // waiting in the queue
}

type prefetcher struct {
	cfg      PrefetchConfig
	maxSlots int
	queue    []*prefetch
	// byReq names the prefetch each of its contexts belongs to, for the
	// slots its promotions hold (PromotionDone).
	byReq    map[*offload.ReqContext]*prefetch
	inFlight int
	// holds are the landed blocks held for their requests, until a
	// deadline; holdsFirst is no later than the earliest (zero: none):
	// steps before it skip the scan.
	holds      map[offload.Key]time.Time
	holdsFirst time.Time
	stats      PrefetchStats
}

func newPrefetcher(cfg PrefetchConfig, numSlots int) *prefetcher {
	if cfg.Share == 0 {
		cfg.Share = DefaultPrefetchShare
	}
	if cfg.MaxQueued <= 0 {
		cfg.MaxQueued = DefaultPrefetchQueue
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	p := &prefetcher{cfg: cfg, byReq: map[*offload.ReqContext]*prefetch{}, holds: map[offload.Key]time.Time{}}
	if cfg.Share > 0 {
		p.maxSlots = max(1, int(cfg.Share*float64(numSlots)))
	}
	return p
}

// Prefetch promotes the leading run of keys that req's load filter
// allows toward the primary, until deadline. req must be a context of
// its own (the manager keeps it until the prefetch ends). Promotions it
// starts are submitted at once; keys a tier is not sure of yet are asked
// again at each step's end.
func (m *Manager) Prefetch(keys []offload.Key, req *offload.ReqContext, deadline time.Time) (PrefetchAnswer, error) {
	pf := m.prefetch
	switch {
	case m.closed:
		return PrefetchAnswer{}, ErrClosed
	case pf.maxSlots == 0:
		pf.stats.Refused++
		return PrefetchAnswer{}, fmt.Errorf("%w: prefetch is off (prefetch.share < 0)", ErrPrefetchRefused)
	case len(pf.queue) >= pf.cfg.MaxQueued:
		pf.stats.Refused++
		return PrefetchAnswer{}, fmt.Errorf("%w: %d prefetches wait already (prefetch.max_queued)", ErrPrefetchRefused, len(pf.queue))
	case req == nil || pf.byReq[req] != nil:
		return PrefetchAnswer{}, errors.New("tiering: a prefetch needs a request context of its own")
	}
	if !m.polled {
		m.poll()
	}
	pf.stats.Started++
	// Known, and counted as waiting, before its promotions are submitted:
	// a tier that fails one at once answers it inside the submission.
	p := &prefetch{req: req, keys: keys, deadline: deadline, queued: true}
	pf.byReq[req] = p
	before := pf.stats.Promotions
	m.advance(p)
	a := PrefetchAnswer{Started: int(pf.stats.Promotions - before)}
	a.Present = p.next - a.Started
	m.flushPromotionsOf(req)
	if m.prefetchDone(p) {
		p.queued = false
		if p.inFlight == 0 {
			delete(pf.byReq, req)
		}
		return a, nil
	}
	pf.queue = append(pf.queue, p)
	a.Queued = true
	return a, nil
}

// advance resolves p's keys from p.next on, in order: a key in the
// primary (ready, or arriving) is resolved; one a tier the filter allows
// holds is promoted while the share has room; a key no tier is sure of
// yet, or a full share, stops the scan until the next step; a miss ends
// the run.
func (m *Manager) advance(p *prefetch) {
	pf := m.prefetch
	for p.next < len(p.keys) {
		k := p.keys[p.next]
		if _, ok := m.primary.RefCount(k); ok {
			p.next++
			continue
		}
		if pf.inFlight+len(pf.holds) >= pf.maxSlots {
			return
		}
		r, i := m.stack.Lookup(k, p.req)
		switch r {
		case offload.Hit:
			if m.promote(i, k, p.req) == offload.Miss {
				return // the primary cannot make room now
			}
			pf.inFlight++
			p.inFlight++
			pf.stats.Promotions++
			p.next++
		case offload.Miss:
			p.keys = p.keys[:p.next] // the run ends here
			return
		default:
			return
		}
	}
}

// prefetchDone reports whether p has nothing left to do: counted
// completed when its run is resolved.
func (m *Manager) prefetchDone(p *prefetch) bool {
	if p.next < len(p.keys) {
		return false
	}
	m.prefetch.stats.Completed++
	return true
}

// stepPrefetches expires the prefetches whose deadline passed and
// advances the others; at each step's end, before the step's promotions
// are submitted.
func (m *Manager) stepPrefetches() {
	pf := m.prefetch
	if len(pf.holds) == 0 && len(pf.queue) == 0 {
		return
	}
	now := pf.cfg.Now()
	if len(pf.holds) > 0 && now.After(pf.holdsFirst) {
		pf.holdsFirst = time.Time{}
		for k, until := range pf.holds {
			switch {
			case now.After(until):
				m.releaseHold(k)
			case pf.holdsFirst.IsZero() || until.Before(pf.holdsFirst):
				pf.holdsFirst = until
			}
		}
	}
	if len(pf.queue) == 0 {
		return
	}
	kept := pf.queue[:0]
	for _, p := range pf.queue {
		switch {
		case now.After(p.deadline):
			pf.stats.Expired++
		default:
			m.advance(p)
			if !m.prefetchDone(p) {
				kept = append(kept, p)
				continue
			}
		}
		p.queued = false
		if p.inFlight == 0 {
			delete(pf.byReq, p.req)
		}
	}
	clear(pf.queue[len(kept):])
	pf.queue = kept
}

// promotionLanded releases the share a prefetch's promotion held; the
// prefetch is forgotten once it waits no more and nothing of it is in
// flight.
func (m *Manager) promotionLanded(j *offload.Job, loaded []offload.Key) {
	pf := m.prefetch
	p, ok := pf.byReq[j.Req]
	if !ok {
		return
	}
	pf.inFlight -= len(j.Keys)
	p.inFlight -= len(j.Keys)
	for _, k := range loaded {
		if _, held := pf.holds[k]; held {
			continue
		}
		m.one[0] = k
		if _, err := m.primary.PrepareLoad(m.one[:]); err == nil {
			pf.holds[k] = p.deadline
			if pf.holdsFirst.IsZero() || p.deadline.Before(pf.holdsFirst) {
				pf.holdsFirst = p.deadline
			}
		}
		m.one[0] = ""
	}
	if !p.queued && p.inFlight == 0 {
		delete(pf.byReq, p.req)
	}
}

// yieldHolds releases every prefetch hold, because the engine needs room,
// and reports whether there was any.
func (m *Manager) yieldHolds() bool {
	pf := m.prefetch
	if len(pf.holds) == 0 {
		return false
	}
	pf.stats.Yielded += uint64(len(pf.holds))
	for k := range pf.holds {
		m.releaseHold(k)
	}
	return true
}

// releaseHold releases the hold on a prefetched block, if any.
func (m *Manager) releaseHold(k offload.Key) {
	pf := m.prefetch
	if _, ok := pf.holds[k]; !ok {
		return
	}
	delete(pf.holds, k)
	m.one[0] = k
	if err := m.primary.CompleteLoad(m.one[:]); err != nil {
		m.log.Error("tiering: releasing a prefetched block", "key", k.String(), "err", err)
	}
	m.one[0] = ""
}

// resetPrefetches forgets every prefetch and releases the blocks held for
// them: Reset and Close drop the promotions they started without
// PromotionDone.
func (m *Manager) resetPrefetches() {
	pf := m.prefetch
	for k := range pf.holds {
		m.releaseHold(k)
	}
	clear(pf.queue)
	pf.queue = pf.queue[:0]
	clear(pf.byReq)
	pf.inFlight = 0
}

// PrefetchStats returns the prefetch counters and gauges.
func (m *Manager) PrefetchStats() PrefetchStats {
	s := m.prefetch.stats
	s.Queued, s.InFlight = len(m.prefetch.queue), m.prefetch.inFlight+len(m.prefetch.holds)
	return s
}
