package remote

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvtier/kvtier/confvalue"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/quota"
)

// Budget: a remote tier's max_bytes. A Redis server or an object store
// does not know kvtier's tenants, so kvtier keeps the account itself: a
// ledger of every block the tier wrote (its size and owner, in one LRU
// list per owner), rebuilt from a listing of the server at startup. A
// store that would take the ledger past max_bytes first deletes victims
// on the server — chosen by package quota's rule, the owner furthest
// above its quota first, and the storer's own oldest block when no one
// is above — so that an owner within its quota never loses a block to
// another owner's store. When no victim may be taken the store fails
// with ErrFull and the blocks stay in the primary.
//
// The ledger counts conservatively: a block whose write failed midway
// stays counted (the server may hold it), and a block the server dropped
// by itself (a ttl, maxmemory, a flush) stays counted until a load finds
// it gone or it is chosen as a victim (deleting it again costs nothing).
// Keyspace notifications do not uncount: one can arrive after the key was
// written again, and an undercount would let the server grow past
// max_bytes for good. So the ledger is never below what the tier wrote,
// and what the server holds of the tier's blocks exceeds max_bytes at
// most by the victims whose deletion is in flight.

// ErrFull fails a store job when the tier's max_bytes, as divided
// between tenants, leaves no room for its blocks and nothing may be
// evicted for them.
var ErrFull = errors.New("tier full for this tenant")

// ErrNotFound reports a block the server does not hold; a load that
// meets it drops the block from the Budget.
var ErrNotFound = errors.New("block not found")

// Budget is the ledger behind a remote tier's max_bytes. Safe for
// concurrent use.
type Budget struct {
	mu      sync.Mutex
	t       *quota.Table
	max     int64
	held    []int64  // bytes per owner, of blocks live or being written
	lru     []bentry // per owner: the sentinel of a circular list, newest after it
	ents    map[offload.Key]*bentry
	evicted int64
	full    int64
	// keep reports blocks no victim may be (routers' pins:
	// offload.Keeper); nil keeps none.
	keep func(offload.Key) bool
}

// Keep passes over the blocks keep reports when choosing victims
// (offload.Keeper, for the tier that owns the Budget).
func (b *Budget) Keep(keep func(offload.Key) bool) {
	b.mu.Lock()
	b.keep = keep
	b.mu.Unlock()
}

type bentry struct {
	key        offload.Key
	size       int64
	owner      uint8
	writing    int32 // store jobs writing the block now: not a victim
	confirmed  bool  // the server holds (or may hold) the block
	prev, next *bentry
}

// NewBudget returns an empty ledger of maxBytes divided by shares
// (none: one pool).
func NewBudget(maxBytes int64, shares []quota.Share) (*Budget, error) {
	if maxBytes <= 0 {
		return nil, fmt.Errorf("max_bytes %d: must be > 0", maxBytes)
	}
	t, err := quota.New(shares, maxBytes, func(v int64) string { return confvalue.ByteSize(v).String() })
	if err != nil {
		return nil, err
	}
	b := &Budget{t: t, max: maxBytes, held: make([]int64, t.Owners()), lru: make([]bentry, t.Owners()), ents: map[offload.Key]*bentry{}}
	for i := range b.lru {
		b.lru[i].prev, b.lru[i].next = &b.lru[i], &b.lru[i]
	}
	return b, nil
}

func (b *Budget) unlink(e *bentry) { e.prev.next, e.next.prev = e.next, e.prev }

// pushFront makes e its owner's newest block; pushBack its oldest.
func (b *Budget) pushFront(e *bentry) {
	s := &b.lru[e.owner]
	e.prev, e.next = s, s.next
	s.next.prev, s.next = e, e
}

func (b *Budget) pushBack(e *bentry) {
	s := &b.lru[e.owner]
	e.prev, e.next = s.prev, s
	s.prev.next, s.prev = e, e
}

func (b *Budget) total() int64 {
	var n int64
	for _, h := range b.held {
		n += h
	}
	return n
}

// Admission is the room Admit reserved for one store job's blocks; the
// job gives it back with Settle.
type Admission struct {
	keys []offload.Key
}

// Admit reserves size bytes for each of keys the ledger does not hold
// (a block it holds is only marked as being written again) and returns
// the victims to delete on the server before any block is written. It
// takes nothing and returns ErrFull when the room for every block cannot
// be made.
func (b *Budget) Admit(keys []offload.Key, size int64) (*Admission, []offload.Key, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	// The job's blocks the ledger holds are being written again: none of
	// them may be a victim of the others.
	var fresh []offload.Key
	isFresh := map[offload.Key]bool{}
	for _, k := range keys {
		if e := b.ents[k]; e != nil {
			e.writing++
		} else if !isFresh[k] {
			isFresh[k] = true
			fresh = append(fresh, k)
		}
	}
	p := b.newPicker()
	total := b.total()
	var victims []*bentry
	for _, k := range fresh {
		o := int(b.t.OwnerOf(k))
		for total+size > b.max {
			v := p.next(o)
			if v == nil {
				for _, k := range keys {
					if e := b.ents[k]; e != nil {
						e.writing--
					}
				}
				b.full++
				return nil, nil, ErrFull
			}
			victims = append(victims, v)
			total -= v.size
		}
		p.virt[o] += size
		total += size
	}
	// Room for every block: take the victims, then enter the blocks.
	out := make([]offload.Key, len(victims))
	for i, v := range victims {
		b.dropLocked(v)
		out[i] = v.key
	}
	b.evicted += int64(len(victims))
	for _, k := range fresh {
		e := &bentry{key: k, size: size, owner: b.t.OwnerOf(k)}
		b.ents[k] = e
		b.held[e.owner] += size
		b.pushFront(e)
	}
	for _, k := range keys {
		e := b.ents[k]
		if isFresh[k] {
			e.writing++
			continue
		}
		b.unlink(e)
		b.pushFront(e)
	}
	return &Admission{keys: keys}, out, nil
}

// picker chooses the victims of one admission (or trim) under b.mu:
// what each owner would hold without the victims taken so far, and where
// each owner's walk from its oldest block has reached.
type picker struct {
	b         *Budget
	virt      []int64
	cursor    []*bentry
	exhausted []bool
}

func (b *Budget) newPicker() *picker {
	n := b.t.Owners()
	p := &picker{b: b, virt: append([]int64(nil), b.held...), cursor: make([]*bentry, n), exhausted: make([]bool, n)}
	for o := range p.cursor {
		p.cursor[o] = b.lru[o].prev
	}
	return p
}

// next returns the next victim for a store by storer (-1: a trim, from
// owners above their quotas only), or nil when no owner may give one. A
// block being written, or kept, is never one.
func (p *picker) next(storer int) *bentry {
	for {
		o := p.b.t.Victim(p.virt, p.exhausted, storer)
		if o < 0 {
			return nil
		}
		e := p.cursor[o]
		for e != &p.b.lru[o] && (e.writing > 0 || p.b.keep != nil && p.b.keep(e.key)) {
			e = e.prev
		}
		if e == &p.b.lru[o] {
			p.exhausted[o] = true
			continue
		}
		p.cursor[o] = e.prev
		p.virt[o] -= e.size
		return e
	}
}

// Settle ends the writes Admit began: written[i] says whether the
// server may now hold keys[i] (true after a write that failed midway:
// the ledger does not undercount); a block no write put on the server
// leaves the ledger.
func (b *Budget) Settle(a *Admission, written func(i int) bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, k := range a.keys {
		e := b.ents[k]
		if e == nil || e.writing == 0 {
			continue // a duplicate key of the job, settled already
		}
		e.writing--
		if written(i) {
			e.confirmed = true
		}
		if e.writing == 0 && !e.confirmed {
			b.dropLocked(e)
		}
	}
}

func (b *Budget) dropLocked(e *bentry) {
	b.unlink(e)
	delete(b.ents, e.key)
	b.held[e.owner] -= e.size
}

// Touch makes keys their owners' newest blocks (they were just read).
func (b *Budget) Touch(keys []offload.Key) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, k := range keys {
		if e := b.ents[k]; e != nil {
			b.unlink(e)
			b.pushFront(e)
		}
	}
}

// Forget drops keys the server no longer holds; a block being written
// stays (the write settles it).
func (b *Budget) Forget(keys []offload.Key) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, k := range keys {
		if e := b.ents[k]; e != nil && e.writing == 0 {
			b.dropLocked(e)
		}
	}
}

// Restore enters blocks the server may still hold after their deletion
// failed, as their owners' newest: the next stores take other victims
// first (the failed ones' node may be down).
func (b *Budget) Restore(keys []offload.Key, size int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, k := range keys {
		if e := b.insertLocked(k, size); e != nil {
			b.pushFront(e)
		}
	}
}

// Add enters a block found on the server (a listing at startup) as its
// owner's oldest, unless the ledger holds it.
func (b *Budget) Add(k offload.Key, size int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if e := b.insertLocked(k, size); e != nil {
		b.pushBack(e)
	}
}

// insertLocked counts a block the server holds, not yet in any list; nil
// when the ledger holds it already.
func (b *Budget) insertLocked(k offload.Key, size int64) *bentry {
	if b.ents[k] != nil {
		return nil
	}
	e := &bentry{key: k, size: size, owner: b.t.OwnerOf(k), confirmed: true}
	b.ents[k] = e
	b.held[e.owner] += size
	return e
}

// Trim takes the ledger back under max_bytes after a listing found more
// (max_bytes lowered, quotas changed): it returns the victims to delete,
// from owners above their quotas only.
func (b *Budget) Trim() []offload.Key {
	b.mu.Lock()
	defer b.mu.Unlock()
	p := b.newPicker()
	var out []offload.Key
	for total := b.total(); total > b.max; {
		v := p.next(-1)
		if v == nil {
			break
		}
		total -= v.size
		out = append(out, v.key)
	}
	for _, k := range out {
		b.dropLocked(b.ents[k])
	}
	b.evicted += int64(len(out))
	return out
}

// NewBudget returns the Budget of s's max_bytes and shares, or nil when
// max_bytes is 0.
func (s Shared) NewBudget() (*Budget, error) {
	if s.MaxBytes == 0 {
		return nil, nil
	}
	b, err := NewBudget(int64(s.MaxBytes), s.Shares)
	if err != nil {
		return nil, fmt.Errorf("max_bytes: %w", err)
	}
	return b, nil
}

// ListFunc calls add, possibly from several goroutines, for each of the
// tier's blocks the server holds, with its size on the server.
type ListFunc func(ctx context.Context, add func(k offload.Key, size int64)) error

// Fill enters the blocks list finds, deletes the oldest of those that
// take the ledger past max_bytes (Trim), and logs what it found. A tier
// that fails to fill its ledger must not start: it would write past
// max_bytes.
func (b *Budget) Fill(ctx context.Context, list ListFunc, del DeleteFunc, log *slog.Logger) error {
	start := time.Now()
	var n atomic.Int64
	if err := list(ctx, func(k offload.Key, size int64) {
		n.Add(1)
		b.Add(k, size)
	}); err != nil {
		return fmt.Errorf("max_bytes: listing the server: %w", err)
	}
	victims := b.Trim()
	if len(victims) > 0 {
		if failed, err := del(ctx, victims); len(failed) > 0 || err != nil {
			return fmt.Errorf("max_bytes: deleting %d of %d blocks over it: %w", len(failed), len(victims), err)
		}
	}
	st := b.Stats()
	log.Info("max_bytes: the tier's blocks on the server counted", "blocks", n.Load(), "bytes", st.Bytes,
		"max_bytes", st.MaxBytes, "deleted_over_max", len(victims), "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// AddTo puts the ledger's figures into a tier's report: its blocks as the
// occupancy, its deletions as the evictions, its tenants' shares.
func (b *Budget) AddTo(r *offload.TierReport) {
	if b == nil {
		return
	}
	st := b.Stats()
	r.OccupancyBlocks, r.OccupancyBytes = st.Blocks, st.Bytes
	r.Evictions = uint64(st.Evicted)
	r.Shares = st.Shares
	if r.Remote != nil {
		r.Remote.StoresFull = uint64(st.Full)
	}
}

// BudgetStats are a Budget's figures.
type BudgetStats struct {
	Blocks, Bytes, MaxBytes int64
	// Evicted counts the blocks deleted to make room; Full the store
	// jobs refused for lack of it.
	Evicted, Full int64
	Shares        []offload.ShareReport
}

// Stats returns the ledger's figures; Shares only when tenants divide
// the capacity.
func (b *Budget) Stats() BudgetStats {
	b.mu.Lock()
	defer b.mu.Unlock()
	st := BudgetStats{Blocks: int64(len(b.ents)), Bytes: b.total(), MaxBytes: b.max, Evicted: b.evicted, Full: b.full}
	if b.t.Owners() > 1 {
		st.Shares = b.t.Report(append([]int64(nil), b.held...))
	}
	return st
}
