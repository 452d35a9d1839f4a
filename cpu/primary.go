package cpu

import (
	"errors"
	"fmt"

	"github.com/kvtier/kvtier/cpu/arena"
	"github.com/kvtier/kvtier/offload"
)

// Errors returned by PrepareLoad and CompleteLoad, which are caller bugs
// (the tiering manager only loads keys it saw HIT and unpins what it
// pinned); they are reported rather than asserted so that a bad request
// cannot crash the daemon.
var (
	ErrUnknownKey = errors.New("key not in primary tier")
	ErrNotReady   = errors.New("block not ready (store in flight)")
	ErrNotPinned  = errors.New("block not pinned")
	// ErrNotLeased reports a slot Bind or Unlease was given that is not
	// leased.
	ErrNotLeased = errors.New("slot not leased")
	// ErrSlotOutOfRange is offload.ErrSlotOutOfRange: PinSlots or
	// UnpinSlots was given a slot outside the arena.
	ErrSlotOutOfRange = offload.ErrSlotOutOfRange
)

// policy orders blocks for eviction. It shares the blocks table with the
// Primary and keeps its lists in blocks.links and slotMeta.list; ref
// counts and free slots are the Primary's business.
type policy interface {
	name() string
	inserted(s int32)        // a new block, pending, indexed
	removed(s int32)         // a pending block whose store failed
	becameEvictable(s int32) // ref reached 0
	pinned(s int32)          // ref left 0 for a reader
	touch(keys []offload.Key)
	// evict appends n victims to out and unlists them, choosing only
	// blocks with ref 0 whose mark is not epoch, in the policy's order; a
	// block held by soft pins only is a victim if revoke releases them.
	// With fewer candidates it returns out unchanged and false, having
	// changed nothing but the soft pins revoke released.
	evict(n int, epoch uint32, out []int32, revoke func(int32) bool) ([]int32, bool)
	// startPick, pickOne and commit are evict in steps, for a caller
	// that chooses victims across policies (shares.go): pickOne returns
	// the next victim evict would take, or -1, changing nothing but the
	// soft pins revoke released; commit unlists the victims picked.
	startPick(epoch uint32, revoke func(int32) bool)
	pickOne() int32
	commit(victims []int32)
	// forgetHistory drops what the policy remembers of blocks gone (ARC's
	// ghosts and target).
	forgetHistory()
	clear()
}

// Primary is the CPU primary tier. See the package documentation.
type Primary struct {
	b   blocks
	pol policy
	lru *lruPolicy // pol when it is LRU: direct calls on hot paths
	arc *arcPolicy // pol when it is ARC
	sh  *shares    // pol when the primary has shares
	// listsPending: the policy lists pending blocks (ARC), so it must
	// hear of each new one (LRU lists ready blocks only).
	listsPending bool
	arena        *arena.Arena
	slotSize     int
	numSlots     int32

	numAllocated int32 // slots [0, numAllocated) have been handed out at least once
	// Freed slots are reused last-in first-out, chained through their
	// links.next (a free slot is on no list).
	freeHead     int32
	numFree      int
	numBlocks    int // keys present (pending or ready)
	numPending   int // ref == -1
	numEvictable int // ref == 0
	numLeased    int // ref == refLeased: leased, no key (lease.go)
	// numRevocable counts ready blocks held by soft pins only (ref ==
	// soft > 0): listed, and evictable once the Revoker releases them.
	numRevocable int
	revoker      Revoker
	revokeFn     func(int32) bool // p.revoke, bound once: a method value per call would allocate
	epoch        uint32           // marks the slots protected by the current call

	reuse     *reuseTracker // nil unless the reuse filter is on
	events    bool
	evs       []offload.Event
	ctr       counters
	allocHist [allocBuckets]uint64

	// Scratch reused across calls so that the store path does not allocate
	// beyond its results. After a successful PrepareStore, newKeys and
	// newSlots are the keys it reserved and their slots: CompleteStore and
	// PrepareLoad try them before hashing (see hint).
	newKeys  []offload.Key
	newHash  []uint64
	newSlots []int32
	victims  []int32
	unpinned []int32
	reused   []offload.Key
	order    []int32
	seen     map[uint64]int32
}

// New allocates the arena and the metadata of a primary tier.
func New(cfg Config) (*Primary, error) {
	n, err := cfg.numSlots()
	if err != nil {
		return nil, err
	}
	polName, err := cfg.policy()
	if err != nil {
		return nil, err
	}
	kind, err := cfg.Arena.Kind.arenaKind()
	if err != nil {
		return nil, err
	}
	threshold, trackerSize, err := cfg.reuse()
	if err != nil {
		return nil, err
	}
	a, err := arena.New(arena.Config{SlotSize: cfg.SlotSize, NumSlots: n, Kind: kind, Path: cfg.Arena.Path})
	if err != nil {
		return nil, fmt.Errorf("cpu: %d slots of %d bytes: %w", n, cfg.SlotSize, err)
	}
	num, den := lruLoadNum, lruLoadDen
	if polName == PolicyARC {
		num, den = arcLoadNum, arcLoadDen
	}
	p := &Primary{
		b:        newBlocks(n, num, den),
		arena:    a,
		slotSize: cfg.SlotSize,
		numSlots: int32(n),
		freeHead: -1,
		events:   cfg.Events,
	}
	if threshold > 0 {
		p.reuse = newReuseTracker(threshold, trackerSize)
	}
	p.revokeFn = p.revoke
	p.listsPending = polName == PolicyARC
	switch {
	case len(cfg.Shares) > 0:
		if p.sh, err = newShares(&p.b, n, cfg.Shares, polName == PolicyARC); err != nil {
			_ = a.Close()
			return nil, err
		}
		p.pol = p.sh
	case polName == PolicyARC:
		p.arc = newARC(&p.b, n)
		p.pol = p.arc
	default:
		p.lru = newLRU(&p.b)
		p.pol = p.lru
	}
	return p, nil
}

// NumSlots returns the number of slots (blocks the tier can hold).
func (p *Primary) NumSlots() int { return int(p.numSlots) }

// SlotSize returns the size of a slot in bytes.
func (p *Primary) SlotSize() int { return p.slotSize }

// Policy returns the eviction policy's name, "lru" or "arc".
func (p *Primary) Policy() string { return p.pol.name() }

// Arena returns the slot memory.
func (p *Primary) Arena() offload.Arena { return p.arena }

// SlotArena returns the slot memory with its backing file, for handing it
// to an engine.
func (p *Primary) SlotArena() *arena.Arena { return p.arena }

// Lookup reports whether k is held: Miss, Hit, or HitPending while its
// store is in flight. It never changes recency and does not allocate; with
// the reuse filter on it counts the lookup of k.
func (p *Primary) Lookup(k offload.Key) offload.LookupResult {
	p.ctr.lookups++
	h := p.b.hash(k)
	if p.reuse != nil {
		p.reuse.seen(h)
	}
	s := p.b.find(k, h)
	if s < 0 {
		p.ctr.misses++
		return offload.Miss
	}
	p.ctr.hits++
	if p.b.meta[s].ref < 0 {
		return offload.HitPending
	}
	return offload.Hit
}

// SlotOf returns the slot holding k.
func (p *Primary) SlotOf(k offload.Key) (int64, bool) {
	s := p.b.lookup(k)
	return int64(s), s >= 0
}

// SlotGen returns how many blocks slot has been given so far, modulo
// 2^16. A block's bytes never change while it holds its slot, so a reader
// holding a pin may keep what it derived from them (a checksum) under
// (slot, gen): the slot's next block has another gen — and so do the
// next 65 535, so something kept is only ever mistaken for a later
// block's if the slot took a multiple of 65 536 blocks with no reader
// refreshing it in between.
func (p *Primary) SlotGen(slot int64) uint16 {
	if slot < 0 || slot >= int64(len(p.b.gen)) {
		return 0
	}
	return p.b.gen[slot]
}

// RefCount returns k's reference count: -1 pending, 0 ready, n > 0 pinned
// by n readers.
func (p *Primary) RefCount(k offload.Key) (ref int32, ok bool) {
	s := p.b.lookup(k)
	if s < 0 {
		return 0, false
	}
	return p.b.meta[s].ref, true
}

// PrepareLoad pins every key for reading (ref++) and returns their slots
// in the order of keys; a key listed twice is pinned twice. If any key is
// absent or pending it returns an error and pins nothing.
func (p *Primary) PrepareLoad(keys []offload.Key) ([]int64, error) {
	return p.prepareLoad(keys, false)
}

// PrepareLoadPresent is PrepareLoad for keys that may have gone since
// they were looked up — in a daemon another client's stores can evict a
// block between the lookup that answered HIT and this call: a key absent
// or pending answers slot -1 and is not pinned, the others are pinned as
// PrepareLoad pins them. missing counts the -1s.
func (p *Primary) PrepareLoadPresent(keys []offload.Key) (slots []int64, missing int) {
	slots = make([]int64, len(keys))
	j := 0
	for i, k := range keys {
		s := p.hint(k, &j)
		if s < 0 {
			s = p.b.lookup(k)
		}
		if s < 0 || p.b.meta[s].ref < 0 {
			slots[i] = -1
			missing++
			continue
		}
		slots[i] = int64(s)
	}
	if missing == 0 {
		p.pin(slots)
		return slots, 0
	}
	present := make([]int64, 0, len(keys)-missing)
	for _, s := range slots {
		if s >= 0 {
			present = append(present, s)
		}
	}
	p.pin(present)
	return slots, missing
}

// PinSoft is PrepareLoad with soft pins, for a cascade: a block held by
// soft pins only keeps its place in the eviction order (as if it were
// not pinned) and, when eviction reaches it, the Revoker is asked to
// release them; a block it releases is evicted where the primary alone
// would have evicted it. Release soft pins with UnpinSoft.
func (p *Primary) PinSoft(keys []offload.Key) ([]int64, error) {
	return p.prepareLoad(keys, true)
}

func (p *Primary) prepareLoad(keys []offload.Key, soft bool) ([]int64, error) {
	slots := make([]int64, len(keys))
	j := 0
	for i, k := range keys {
		s := p.hint(k, &j)
		if s < 0 {
			if s = p.b.lookup(k); s < 0 {
				return nil, fmt.Errorf("cpu: prepare load %s: %w", k, ErrUnknownKey)
			}
		}
		if p.b.meta[s].ref < 0 {
			return nil, fmt.Errorf("cpu: prepare load %s: %w", k, ErrNotReady)
		}
		slots[i] = int64(s)
	}
	if soft {
		if err := p.pinSoft(slots); err != nil {
			return nil, err
		}
		return slots, nil
	}
	p.pin(slots)
	return slots, nil
}

// PinSlots pins the blocks in slots for reading like PrepareLoad, without
// looking keys up: a caller that holds pins on blocks (their slots came
// from PrepareLoad and are not unpinned yet) takes more pins on them, e.g.
// one per cascade job. A slot names a block only while something keeps it
// from being evicted, so slots of unpinned blocks must not be passed. If a
// slot is out of range, free or pending it returns an error and pins
// nothing.
func (p *Primary) PinSlots(slots []int64) error {
	if err := p.checkPinnable(slots); err != nil {
		return err
	}
	p.pin(slots)
	return nil
}

// PinSlotsSoft is PinSlots with soft pins (see PinSoft).
func (p *Primary) PinSlotsSoft(slots []int64) error {
	if err := p.checkPinnable(slots); err != nil {
		return err
	}
	return p.pinSoft(slots)
}

// maxSoftPins bounds the soft pins of one block (a cascade to every tier,
// several times over).
const maxSoftPins = 1 << 15

func (p *Primary) checkPinnable(slots []int64) error {
	for _, s := range slots {
		if s < 0 || s >= int64(p.numSlots) {
			return fmt.Errorf("cpu: pin slot %d: %w", s, ErrSlotOutOfRange)
		}
		switch m := &p.b.meta[s]; {
		case m.ref < 0:
			return fmt.Errorf("cpu: pin slot %d: %w", s, ErrNotReady)
		case m.ref == 0 && m.list == inNoList: // ready blocks are listed
			return fmt.Errorf("cpu: pin slot %d (free): %w", s, ErrUnknownKey)
		}
	}
	return nil
}

// pin takes hard pins: the block leaves the eviction order until its
// last hard pin goes.
func (p *Primary) pin(slots []int64) {
	for _, s := range slots {
		m := &p.b.meta[s]
		if m.ref == int32(m.soft) { // evictable or revocable: listed
			if m.ref == 0 {
				p.numEvictable--
			} else {
				p.numRevocable--
			}
			if p.lru != nil {
				p.lru.pinned(int32(s))
			} else {
				p.pol.pinned(int32(s))
			}
		}
		m.ref++
	}
	p.ctr.loads += uint64(len(slots))
}

// pinSoft takes soft pins: the block keeps its place in the policy's
// lists. A block already holding maxSoftPins fails the call, which then
// pins nothing.
func (p *Primary) pinSoft(slots []int64) error {
	for i, s := range slots {
		m := &p.b.meta[s]
		if m.soft >= maxSoftPins {
			if err := p.UnpinSoft(slots[:i]); err != nil {
				panic("cpu: undoing soft pins: " + err.Error()) // cannot fail: they were just taken
			}
			return fmt.Errorf("cpu: soft pin slot %d: more than %d soft pins", s, maxSoftPins)
		}
		if m.ref == 0 {
			p.numEvictable--
			p.numRevocable++
		}
		m.ref++
		m.soft++
	}
	return nil
}

// UnpinSoft releases soft pins taken by PinSoft or PinSlotsSoft. The block
// does not move in the eviction order. It may be called by the Revoker
// during an eviction. If a slot is out of range or holds fewer soft pins
// than it is listed it returns an error and unpins nothing.
func (p *Primary) UnpinSoft(slots []int64) error {
	// Check by counting down (a slot may be listed more than once), and
	// undo on error, so that a bad call changes nothing.
	for i, s := range slots {
		var err error
		switch {
		case s < 0 || s >= int64(p.numSlots):
			err = ErrSlotOutOfRange
		case p.b.meta[s].soft == 0:
			err = ErrNotPinned
		}
		if err != nil {
			for _, u := range slots[:i] {
				p.b.meta[u].soft++
			}
			return fmt.Errorf("cpu: soft unpin slot %d: %w", s, err)
		}
		p.b.meta[s].soft--
	}
	for _, s := range slots {
		m := &p.b.meta[s]
		// m.soft is already down by this call's pins on s: the block was
		// revocable iff its hard pins (ref - soft - pins) were none, and
		// it becomes evictable when ref reaches 0.
		m.ref--
		if m.ref == 0 {
			p.numRevocable--
			p.numEvictable++
		}
	}
	return nil
}

// Revoker releases the soft pins on a block that eviction reached (it
// calls UnpinSoft, and nothing else of the Primary) and reports whether it
// did; the block is evicted only if no pin is left on it.
type Revoker func(slot int64) bool

// SetRevoker installs the function eviction asks to release soft pins;
// without one, softly pinned blocks are never evicted.
func (p *Primary) SetRevoker(r Revoker) { p.revoker = r }

// revoke asks the revoker to release the soft pins on s, a block held by
// soft pins only, and reports whether it is now unpinned.
func (p *Primary) revoke(s int32) bool {
	if p.revoker == nil {
		return false
	}
	p.ctr.revocations++
	if !p.revoker(int64(s)) {
		return false
	}
	return p.b.meta[s].ref == 0
}

// Touch records a use of keys (GPU prefix-cache hits included) with the
// policy; absent keys are ignored.
func (p *Primary) Touch(keys []offload.Key) { p.pol.touch(keys) }

// CompleteLoad unpins keys (ref--); a block whose last reader finished
// becomes evictable again, as most recently used. If a key is absent or
// not pinned (as many times as it is listed) it returns an error and
// unpins nothing.
func (p *Primary) CompleteLoad(keys []offload.Key) error {
	p.unpinned = p.unpinned[:0]
	for _, k := range keys {
		s := p.b.lookup(k)
		var err error
		switch {
		case s < 0:
			err = ErrUnknownKey
		case p.b.meta[s].ref <= int32(p.b.meta[s].soft):
			err = ErrNotPinned
		}
		if err != nil {
			p.undoUnpins()
			return fmt.Errorf("cpu: complete load %s: %w", k, err)
		}
		p.b.meta[s].ref--
		p.unpinned = append(p.unpinned, s)
	}
	p.publishUnpins()
	return nil
}

// UnpinSlots unpins the blocks in slots like CompleteLoad, without looking
// keys up: slots must be those of pins the caller holds (from PrepareLoad
// or PinSlots). If a slot is out of range or not pinned (as many times as
// it is listed) it returns an error and unpins nothing.
func (p *Primary) UnpinSlots(slots []int64) error {
	p.unpinned = p.unpinned[:0]
	for _, s := range slots {
		var err error
		switch {
		case s < 0 || s >= int64(p.numSlots):
			err = ErrSlotOutOfRange
		case p.b.meta[s].ref <= int32(p.b.meta[s].soft):
			err = ErrNotPinned
		}
		if err != nil {
			p.undoUnpins()
			return fmt.Errorf("cpu: unpin slot %d: %w", s, err)
		}
		p.b.meta[s].ref--
		p.unpinned = append(p.unpinned, int32(s))
	}
	p.publishUnpins()
	return nil
}

// undoUnpins restores the references dropped so far by a failing call:
// nothing was published yet.
func (p *Primary) undoUnpins() {
	for _, u := range p.unpinned {
		p.b.meta[u].ref++
	}
}

// publishUnpins makes evictable the blocks in p.unpinned whose last
// reader finished, as one-at-a-time unpinning would: a block becomes
// evictable at the last occurrence of its slot, in the order of those
// last occurrences. Walking backwards, the epoch mark keeps only the last
// occurrence; the order is then restored. A block whose last hard pin
// went while soft pins remain becomes revocable, listed the same way.
func (p *Primary) publishUnpins() {
	epoch := p.nextEpoch()
	p.order = p.order[:0]
	for i := len(p.unpinned) - 1; i >= 0; i-- {
		s := p.unpinned[i]
		if m := &p.b.meta[s]; m.ref == int32(m.soft) && m.mark != epoch {
			m.mark = epoch
			p.order = append(p.order, s)
		}
	}
	for i := len(p.order) - 1; i >= 0; i-- {
		if s := p.order[i]; p.b.meta[s].ref == 0 {
			p.numEvictable++
		} else {
			p.numRevocable++
		}
		p.becameEvictable(p.order[i])
	}
}

// own counts the new block of k in slot s for its owner, and disown
// counts a slot freed, when the primary has shares.
func (p *Primary) own(s int32, k offload.Key) {
	if p.sh != nil {
		p.sh.take(s, p.sh.ownerOf(k))
	}
}

func (p *Primary) disown(s int32) {
	if p.sh != nil {
		p.sh.drop(s)
	}
}

// storing tells the shares whose store (or lease, owner 0) evicts next.
func (p *Primary) storing(k offload.Key) {
	if p.sh != nil {
		p.sh.storer = 0
		if k != "" {
			p.sh.storer = p.sh.ownerOf(k)
		}
	}
}

// becameEvictable tells the policy that s's ref reached 0.
func (p *Primary) becameEvictable(s int32) {
	if p.lru != nil {
		p.lru.becameEvictable(s)
		return
	}
	p.pol.becameEvictable(s)
}

// nextEpoch starts a new marking round. On wrap-around every mark is
// cleared so that a stale mark can never equal a new epoch.
func (p *Primary) nextEpoch() uint32 {
	p.epoch++
	if p.epoch == 0 {
		for i := range p.b.meta {
			p.b.meta[i].mark = 0
		}
		p.epoch = 1
	}
	return p.epoch
}

// Keys appends to dst the keys of the ready blocks (not pending stores) in
// slots from, from+1, … until it has appended limit keys or reached the
// last slot, and returns the slot to continue from: 0 when the pass is
// done. It lets a peer list what the tier holds page by page, between
// which the tier may change.
func (p *Primary) Keys(from int64, limit int, dst []offload.Key) ([]offload.Key, int64) {
	if from < 0 {
		from = 0
	}
	for s := from; s < int64(p.numSlots); s++ {
		if limit <= 0 {
			return dst, s
		}
		m := &p.b.meta[s]
		if m.key == "" || m.ref < 0 {
			continue
		}
		dst = append(dst, m.key)
		limit--
	}
	return dst, 0
}
