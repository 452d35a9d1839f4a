// Pins with a time to live: a router or an agent keeps a prefix in the
// primary (a system prompt, a session that resumes in 30 s) until the TTL
// passes or it unpins it (issue 41).
//
// A pin is one more load pin on a block that is ready in the primary
// (cpu.Primary.PrepareLoad), held by the manager for the caller: the
// block cannot be evicted while it lasts, and a reset of the primary
// keeps it (cpu.Primary.Reset drops only unheld blocks). Pinning a key
// again extends its TTL, never stacks a second pin. Keys not ready in the
// primary are not pinned (the caller prefetches them first). The blocks
// pinned at once are bounded per owner (a tenant's key space, or the
// untagged pool): PinConfig.Share of the owner's quota, or of the primary
// without quotas; a pin past it is refused, never taken from another
// owner. Pins expire at the first step end after their TTL; they live in
// the daemon and die with it. A tier that chooses its own victims
// (offload.Keeper) is told what is pinned and passes over those blocks
// too (pinnedNow, safe without the caller's lock).

package tiering

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvtier/kvtier/offload"
)

// ErrPinRefused reports a pin call while pins are off. (Keys over their
// owner's budget are counted in the answer instead: the others are
// pinned.)
var ErrPinRefused = errors.New("tiering: pin refused")

// PinConfig bounds pins.
type PinConfig struct {
	// Share is the share of an owner's quota (of the primary without
	// quotas) its pinned blocks may hold (0: DefaultPinShare; negative:
	// pins off).
	Share float64
	// Now is the clock TTLs are read against (nil: time.Now).
	Now func() time.Time
}

// DefaultPinShare is PinConfig.Share's default.
const DefaultPinShare = 0.25

// PinStats count pins: Pinned and Unpinned (blocks), Expired (blocks
// whose TTL passed), Refused (blocks over the budget); Blocks is the
// blocks pinned now.
type PinStats struct {
	Pinned, Unpinned, Expired, Refused uint64
	Blocks                             int
}

// PinAnswer is what a Pin call did: Pinned keys pinned (or their TTL
// extended), Missing keys not ready in the primary, Refused keys over the
// budget.
type PinAnswer struct {
	Pinned, Missing, Refused int
}

type pinner struct {
	cfg     PinConfig
	expires map[offload.Key]time.Time
	// live mirrors expires' keys for readers without the caller's lock
	// (tiers choosing victims); n counts them, so that a daemon without
	// pins answers without a map lookup.
	live sync.Map
	n    atomic.Int64
	// first is no later than the earliest expiry (zero: none): steps
	// before it skip the scan.
	first time.Time
	// budget and held are per owner (cpu.Primary.OwnerOf); a nil budget
	// means pins are off. held is written under the manager's caller's
	// lock and read without it (PinsOf).
	budget []int
	held   []atomic.Int64
	stats  PinStats
}

func newPinner(m *Manager, cfg PinConfig) *pinner {
	if cfg.Share == 0 {
		cfg.Share = DefaultPinShare
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	p := &pinner{cfg: cfg, expires: map[offload.Key]time.Time{}}
	if cfg.Share < 0 {
		return p
	}
	quotas := m.primary.Quotas()
	if quotas == nil {
		quotas = []int{m.primary.NumSlots()}
	}
	p.budget = make([]int, len(quotas))
	p.held = make([]atomic.Int64, len(quotas))
	for i, q := range quotas {
		p.budget[i] = int(cfg.Share * float64(q))
	}
	return p
}

// Pin keeps keys' blocks in the primary for ttl (extending the TTL of
// those pinned already). It pins the keys ready in the primary, in order,
// while their owners' budgets allow.
func (m *Manager) Pin(keys []offload.Key, ttl time.Duration) (PinAnswer, error) {
	pn := m.pins
	switch {
	case m.closed:
		return PinAnswer{}, ErrClosed
	case pn.budget == nil:
		pn.stats.Refused += uint64(len(keys))
		return PinAnswer{Refused: len(keys)}, fmt.Errorf("%w: pins are off (pins.share < 0)", ErrPinRefused)
	case ttl <= 0:
		return PinAnswer{}, errors.New("tiering: a pin needs a positive TTL")
	}
	m.expirePins()
	until := pn.cfg.Now().Add(ttl)
	if pn.first.IsZero() || until.Before(pn.first) {
		pn.first = until
	}
	var a PinAnswer
	for _, k := range keys {
		if old, ok := pn.expires[k]; ok {
			if until.After(old) {
				pn.expires[k] = until
			}
			a.Pinned++
			continue
		}
		if ref, ok := m.primary.RefCount(k); !ok || ref < 0 {
			a.Missing++
			continue
		}
		o := m.owner(k)
		if pn.held[o].Load() >= int64(pn.budget[o]) {
			a.Refused++
			continue
		}
		m.one[0] = k
		_, err := m.primary.PrepareLoad(m.one[:])
		m.one[0] = ""
		if err != nil {
			a.Missing++ // not ready after all
			continue
		}
		pn.expires[k] = until
		pn.live.Store(k, struct{}{})
		pn.n.Add(1)
		pn.held[o].Add(1)
		pn.stats.Pinned++
		a.Pinned++
	}
	pn.stats.Refused += uint64(a.Refused)
	return a, nil
}

// PinsOf returns the router pins the owner of key space space holds now;
// safe without the caller's lock.
func (m *Manager) PinsOf(space uint64) int {
	o := m.primary.OwnerOfSpace(space)
	if m.pins.budget == nil || o < 0 || o >= len(m.pins.held) {
		return 0
	}
	return int(m.pins.held[o].Load())
}

// owner is the pin budget's index of k's owner.
func (m *Manager) owner(k offload.Key) int {
	o := m.primary.OwnerOf(k)
	if o < 0 || o >= len(m.pins.budget) {
		return 0
	}
	return o
}

// Unpin releases the pins of keys (keys not pinned are skipped) and
// returns how many it released.
func (m *Manager) Unpin(keys []offload.Key) int {
	n := 0
	for _, k := range keys {
		if _, ok := m.pins.expires[k]; ok {
			m.unpin(k)
			n++
		}
	}
	m.pins.stats.Unpinned += uint64(n)
	return n
}

func (m *Manager) unpin(k offload.Key) {
	pn := m.pins
	delete(pn.expires, k)
	pn.live.Delete(k)
	pn.n.Add(-1)
	pn.held[m.owner(k)].Add(-1)
	m.one[0] = k
	if err := m.primary.CompleteLoad(m.one[:]); err != nil {
		// The pin was this manager's: a failure is a bookkeeping bug.
		m.log.Error("tiering: releasing a router pin", "key", k.String(), "err", err)
	}
	m.one[0] = ""
}

// expirePins releases the pins whose TTL has passed.
func (m *Manager) expirePins() {
	pn := m.pins
	if len(pn.expires) == 0 {
		return
	}
	now := pn.cfg.Now()
	if !now.After(pn.first) {
		return
	}
	pn.first = time.Time{}
	for k, until := range pn.expires {
		switch {
		case now.After(until):
			m.unpin(k)
			pn.stats.Expired++
		case pn.first.IsZero() || until.Before(pn.first):
			pn.first = until
		}
	}
}

// releasePins drops every pin (Close).
func (m *Manager) releasePins() {
	for k := range m.pins.expires {
		m.unpin(k)
	}
}

// PinStats returns the pin counters and the blocks pinned now.
func (m *Manager) PinStats() PinStats {
	s := m.pins.stats
	s.Blocks = len(m.pins.expires)
	return s
}

// pinnedNow reports whether k holds a router pin; safe without the
// caller's lock (offload.Keeper tiers call it while they choose victims).
func (m *Manager) pinnedNow(k offload.Key) bool {
	if m.pins.n.Load() == 0 {
		return false
	}
	_, ok := m.pins.live.Load(k)
	return ok
}

// Pinned reports whether k holds a router pin, and until when.
func (m *Manager) Pinned(k offload.Key) (time.Time, bool) {
	t, ok := m.pins.expires[k]
	return t, ok
}
