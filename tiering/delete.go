// Deletes: a router or an operator removes blocks from every tier, with
// the removal events that let routers' indexes follow (issue 41).

package tiering

import (
	"context"
	"errors"
	"fmt"

	"github.com/kvtier/kvtier/offload"
)

// Deleter is implemented by tiers that remove blocks on request: Delete
// removes those of keys the tier holds, announces them in a removal
// event (TakeEvents) and returns how many it removed. The manager calls
// it from the driving goroutine with none of its jobs in flight.
type Deleter interface {
	Delete(ctx context.Context, keys []offload.Key) (int, error)
}

// TierDelete is one secondary tier's part of a delete.
type TierDelete struct {
	Name string
	// Supported reports that the tier removes blocks on request (a
	// Deleter); a tier that does not keeps them until its own eviction.
	Supported bool
	Removed   int
	Err       error
}

// DeleteAnswer is what a delete removed: Primary blocks from the primary,
// Held blocks it left there because something holds them (an engine's
// load, a promotion arriving), and each tier's part.
type DeleteAnswer struct {
	Primary, Held int
	Tiers         []TierDelete
}

// Delete removes keys' blocks from the primary and from every tier that
// removes blocks on request, releasing routers' pins on them first. It
// waits for the jobs in flight (a cascade would write a block back after
// its deletion), as a reset does, for at most ctx.
func (m *Manager) Delete(ctx context.Context, keys []offload.Key) (DeleteAnswer, error) {
	if m.closed {
		return DeleteAnswer{}, ErrClosed
	}
	// Applying results may start deferred cascades: drain until none is
	// in flight.
	for m.stack.InFlight() > 0 {
		if err := m.stack.Drain(ctx); err != nil {
			return DeleteAnswer{}, fmt.Errorf("tiering: delete: %w", err)
		}
		m.stack.Poll()
	}
	m.Unpin(keys)
	for _, k := range keys {
		m.releaseHold(k)
	}
	var a DeleteAnswer
	a.Primary, a.Held = m.primary.Remove(keys)
	for _, ts := range m.stack.tiers {
		td := TierDelete{Name: ts.name}
		if d, ok := ts.t.(Deleter); ok {
			td.Supported = true
			td.Removed, td.Err = m.stack.tierDelete(ctx, ts, d, keys)
		}
		a.Tiers = append(a.Tiers, td)
	}
	return a, nil
}

// errTierPanicked is a tier's part of a delete when the tier panicked.
var errTierPanicked = errors.New("the tier panicked")

// Lister is implemented by tiers that can list the keys they hold (fs,
// memory), so that a delete can name every block of a key space.
type Lister interface {
	// Keys appends to dst the keys the tier holds for which match is
	// true, and returns dst.
	Keys(match func(offload.Key) bool, dst []offload.Key) []offload.Key
}

// DeleteWhere deletes every block whose key match accepts from the
// primary and from every tier, finding them in the primary and in the
// tiers that list what they hold (Lister); a tier that cannot list keeps
// what it has of them until its own eviction. Listed reports how many
// keys were found.
func (m *Manager) DeleteWhere(ctx context.Context, match func(offload.Key) bool) (a DeleteAnswer, listed int, err error) {
	if m.closed {
		return DeleteAnswer{}, 0, ErrClosed
	}
	seen := map[offload.Key]bool{}
	var keys []offload.Key
	add := func(ks []offload.Key) {
		for _, k := range ks {
			if !seen[k] {
				seen[k] = true
				keys = append(keys, k)
			}
		}
	}
	var batch []offload.Key
	for from := int64(0); ; {
		batch, from = m.primary.Keys(from, 4096, batch[:0])
		var mine []offload.Key
		for _, k := range batch {
			if match(k) {
				mine = append(mine, k)
			}
		}
		add(mine)
		if from == 0 {
			break
		}
	}
	for _, ts := range m.stack.tiers {
		if l, ok := ts.t.(Lister); ok {
			add(l.Keys(match, nil))
		}
	}
	if len(keys) == 0 {
		a.Tiers = make([]TierDelete, 0, len(m.stack.tiers))
		for _, ts := range m.stack.tiers {
			_, ok := ts.t.(Deleter)
			a.Tiers = append(a.Tiers, TierDelete{Name: ts.name, Supported: ok})
		}
		return a, 0, nil
	}
	a, err = m.Delete(ctx, keys)
	return a, len(keys), err
}
