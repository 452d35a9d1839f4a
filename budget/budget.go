package budget

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// ErrTooLarge is returned for a request larger than the share: it could
// never be granted.
var ErrTooLarge = errors.New("budget: request larger than a holder's share")

// ErrBusy is returned at once, without waiting, when as many calls as the
// budget lets wait are waiting already.
var ErrBusy = errors.New("budget: too many waiting")

// Budget grants bytes to holders within a total and a per-holder share.
type Budget struct {
	total, share int64
	maxWaiters   int

	mu      sync.Mutex
	used    int64
	held    map[string]int64
	waiters []*waiter // in arrival order
}

type waiter struct {
	holder  string
	n       int64
	granted chan struct{} // closed when the grant is made
}

// New returns a budget of total bytes of which one holder may hold at
// most share (share <= 0 or share > total: total), and at most maxWaiters
// callers wait for room (maxWaiters <= 0: no bound).
func New(total, share int64, maxWaiters int) (*Budget, error) {
	if total <= 0 {
		return nil, fmt.Errorf("budget: total %d: must be positive", total)
	}
	if share <= 0 || share > total {
		share = total
	}
	return &Budget{total: total, share: share, maxWaiters: maxWaiters, held: map[string]int64{}}, nil
}

// Total and Share return the budget's bounds.
func (b *Budget) Total() int64 { return b.total }
func (b *Budget) Share() int64 { return b.share }

// Used returns the bytes granted now.
func (b *Budget) Used() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// Waiting returns the number of Acquire calls waiting now.
func (b *Budget) Waiting() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.waiters)
}

// Grant is bytes granted to a holder; Release gives them back.
type Grant struct {
	b      *Budget
	holder string
	n      int64
}

// Release gives the grant back. Call it once per grant (a zero Grant's
// Release does nothing).
func (g Grant) Release() {
	if g.b == nil {
		return
	}
	g.b.mu.Lock()
	g.b.giveBackLocked(g.holder, g.n)
	g.b.wakeLocked()
	g.b.mu.Unlock()
}

// Acquire grants n bytes to holder, waiting while they do not fit. It
// returns the grant, or ctx's error (nothing is held then), ErrTooLarge
// when n exceeds the share, or ErrBusy when it would have to wait and the
// waiters are at their bound.
func (b *Budget) Acquire(ctx context.Context, holder string, n int64) (Grant, error) {
	if n > b.share {
		return Grant{}, fmt.Errorf("%w: %d bytes, share %d", ErrTooLarge, n, b.share)
	}
	if n < 0 {
		n = 0
	}
	b.mu.Lock()
	if len(b.waiters) == 0 && b.fitsLocked(holder, n) {
		b.grantLocked(holder, n)
		b.mu.Unlock()
		return Grant{b, holder, n}, nil
	}
	if err := ctx.Err(); err != nil {
		b.mu.Unlock()
		return Grant{}, err
	}
	if b.maxWaiters > 0 && len(b.waiters) >= b.maxWaiters {
		b.mu.Unlock()
		return Grant{}, ErrBusy
	}
	w := &waiter{holder: holder, n: n, granted: make(chan struct{})}
	b.waiters = append(b.waiters, w)
	// Others queued ahead may be at their share while this one fits.
	b.wakeLocked()
	b.mu.Unlock()

	select {
	case <-w.granted:
		return Grant{b, holder, n}, nil
	case <-ctx.Done():
		b.mu.Lock()
		select {
		case <-w.granted:
			// Granted while the context ended: give it back.
			b.giveBackLocked(holder, n)
		default:
			b.removeLocked(w)
		}
		b.wakeLocked()
		b.mu.Unlock()
		return Grant{}, ctx.Err()
	}
}

func (b *Budget) fitsLocked(holder string, n int64) bool {
	return b.used+n <= b.total && b.held[holder]+n <= b.share
}

func (b *Budget) grantLocked(holder string, n int64) {
	b.used += n
	b.held[holder] += n
}

func (b *Budget) giveBackLocked(holder string, n int64) {
	b.used -= n
	if h := b.held[holder] - n; h > 0 {
		b.held[holder] = h
	} else {
		delete(b.held, holder)
	}
}

func (b *Budget) removeLocked(w *waiter) {
	for i, x := range b.waiters {
		if x == w {
			b.waiters = append(b.waiters[:i], b.waiters[i+1:]...)
			return
		}
	}
}

// wakeLocked grants, in arrival order, every waiter that fits.
func (b *Budget) wakeLocked() {
	kept := b.waiters[:0]
	for _, w := range b.waiters {
		if b.fitsLocked(w.holder, w.n) {
			b.grantLocked(w.holder, w.n)
			close(w.granted)
			continue
		}
		kept = append(kept, w)
	}
	clear(b.waiters[len(kept):])
	b.waiters = kept
}
