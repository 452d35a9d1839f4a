package ticket

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Errors of Redeem. A caller may tell them apart in its logs; what it
// tells the holder should not help guessing.
var (
	// ErrUnknown: no such ticket (never issued, spent, or forgotten).
	ErrUnknown = errors.New("ticket: unknown or already used")
	// ErrExpired: the ticket's time passed before it was redeemed.
	ErrExpired = errors.New("ticket: expired")
	// ErrSubject: the ticket was issued for another subject.
	ErrSubject = errors.New("ticket: issued for something else")
)

type id [16]byte

type entry struct {
	subject string
	expires time.Time
}

// Book issues and redeems tickets.
type Book struct {
	ttl time.Duration
	max int
	now func() time.Time

	mu      sync.Mutex
	tickets map[id]entry
	order   []id // issue order: the oldest first, spent ones included
}

// New returns a Book whose tickets live for ttl, holding at most max.
func New(ttl time.Duration, max int) *Book {
	return &Book{ttl: ttl, max: max, now: time.Now, tickets: make(map[id]entry)}
}

// Issue returns a new ticket for subject.
func (b *Book) Issue(subject string) (string, error) {
	var t id
	if _, err := rand.Read(t[:]); err != nil {
		return "", fmt.Errorf("ticket: %w", err)
	}
	now := b.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	b.forget(now)
	b.tickets[t] = entry{subject: subject, expires: now.Add(b.ttl)}
	b.order = append(b.order, t)
	return hex.EncodeToString(t[:]), nil
}

// forget drops spent and expired tickets from the front of the order, and
// the oldest live ones past max. Called with mu held.
func (b *Book) forget(now time.Time) {
	i := 0
	for ; i < len(b.order); i++ {
		e, live := b.tickets[b.order[i]]
		if live && now.Before(e.expires) && len(b.tickets) < b.max {
			break
		}
		delete(b.tickets, b.order[i])
	}
	b.order = b.order[i:]
	// Spent tickets in the middle of the order stay until they reach the
	// front; compact when they are most of it so that order stays bounded.
	if len(b.order) > 2*b.max {
		kept := b.order[:0]
		for _, t := range b.order {
			if _, live := b.tickets[t]; live {
				kept = append(kept, t)
			}
		}
		b.order = append([]id(nil), kept...)
	}
}

// Redeem spends ticket tk, issued for subject.
func (b *Book) Redeem(tk, subject string) error {
	var t id
	// The length first: hex.Decode writes past t for a longer string.
	if len(tk) != hex.EncodedLen(len(t)) {
		return ErrUnknown
	}
	if _, err := hex.Decode(t[:], []byte(tk)); err != nil {
		return ErrUnknown
	}
	now := b.now()
	b.mu.Lock()
	e, ok := b.tickets[t]
	delete(b.tickets, t)
	b.mu.Unlock()
	switch {
	case !ok:
		return ErrUnknown
	case !now.Before(e.expires):
		return ErrExpired
	case e.subject != subject:
		return ErrSubject
	}
	return nil
}

// Len returns the tickets held (issued, neither spent nor forgotten).
func (b *Book) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.tickets)
}
