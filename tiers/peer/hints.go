package peer

import (
	"encoding/binary"
	"math/bits"
	"sync/atomic"

	"github.com/kvtier/kvtier/offload"
)

// Media bits of a hint: where the peer's events say it holds a block.
const (
	onCPU     uint64 = 1 // the peer's primary (DRAM): what a peer read serves
	onStorage uint64 = 2 // one of the peer's secondary tiers
	mediaMask        = onCPU | onStorage
)

// minHintBuckets is the smallest table.
const minHintBuckets = 1024

// tagOf is a block's identity in the hints: its wire hash (what the
// events carry) and its KV group, multiplied by an odd constant. The
// product is a bijection whose high bits (the home bucket) depend on
// every bit, and hashes that differ in a few bits differ in more than the
// two low bits left for the media. Two blocks may still share a tag; a
// hint is only a hint.
func tagOf(wire uint64, group uint32) uint64 {
	t := ((wire ^ uint64(group)<<32) * 0x9e3779b97f4a7c15) &^ mediaMask
	if t == 0 {
		t = mediaMask + 1
	}
	return t
}

// keyTag is the tag of key k. Keys of an 8-byte hash or longer (all that
// engines make) are read with two loads, inline: it is on every lookup.
func keyTag(k offload.Key) uint64 {
	n := len(k)
	if n < 8+offload.GroupSuffixLen {
		return shortKeyTag(k)
	}
	b := []byte(k[n-12:]) // not copied: it neither escapes nor changes
	return tagOf(binary.BigEndian.Uint64(b), binary.BigEndian.Uint32(b[8:]))
}

func shortKeyTag(k offload.Key) uint64 { return tagOf(k.WireHash(), k.Group()) }

// hints is the bounded index of one peer: tag → media, built from the
// peer's block list and kept current from its KV events.
//
// Concurrency: one writer (the peer's feed goroutine) and any number of
// readers without locks. A bucket only ever changes from empty to an
// entry, or from an entry to the same tag with other media (media 0 is a
// tombstone), so a reader's probe, which stops at the first empty bucket,
// always ends; a table that is replaced is not written again.
type hints struct {
	cur atomic.Pointer[hintTable]
	// The writer's bookkeeping.
	live, used int // entries with media; buckets not empty
	max        int // bound on live entries
}

type hintTable struct {
	b     []atomic.Uint64 // tag | media; 0 = empty
	mask  uint64
	shift uint
}

func newHintTable(buckets int) *hintTable {
	n := max(minHintBuckets, 1<<bits.Len(uint(buckets-1)))
	return &hintTable{b: make([]atomic.Uint64, n), mask: uint64(n - 1), shift: uint(64 - bits.TrailingZeros(uint(n)))}
}

// home is the first bucket of tag: its high bits (tags are mixed).
func (t *hintTable) home(tag uint64) uint64 { return tag >> t.shift }

func newHints(maxKeys int) *hints {
	h := &hints{max: maxKeys}
	h.cur.Store(newHintTable(minHintBuckets))
	return h
}

// media returns the media bits of tag (0: not held).
func (h *hints) media(tag uint64) uint64 {
	t := h.cur.Load()
	for i := t.home(tag); ; i = (i + 1) & t.mask {
		// Most lookups end at their home bucket, on a match.
		e := t.b[i].Load()
		if e&^mediaMask == tag {
			return e & mediaMask
		}
		if e == 0 {
			return 0
		}
	}
}

// add sets media bits m on tag. It returns false, changing nothing, when
// the tag is new and the index holds its bound already.
func (h *hints) add(tag, m uint64) bool { return h.update(tag, m, true) }

// remove clears media bits m of tag.
func (h *hints) remove(tag, m uint64) { h.update(tag, m, false) }

func (h *hints) update(tag, m uint64, set bool) bool {
	t := h.cur.Load()
	tomb := -1
	i := t.home(tag)
	for ; ; i = (i + 1) & t.mask {
		e := t.b[i].Load()
		if e == 0 {
			break
		}
		if e&^mediaMask != tag {
			if e&mediaMask == 0 && tomb < 0 {
				tomb = int(i)
			}
			continue
		}
		old := e & mediaMask
		now := old &^ m
		if set {
			now = old | m
		}
		switch {
		case now == old:
			return true
		case old == 0:
			if h.live >= h.max {
				return false
			}
			h.live++
		case now == 0:
			h.live--
		}
		t.b[i].Store(tag | now)
		return true
	}
	if !set {
		return true
	}
	if h.live >= h.max {
		return false
	}
	h.live++
	if tomb >= 0 {
		// Another tag's tombstone: its readers keep probing past tag and
		// miss, as they should.
		t.b[tomb].Store(tag | m)
		return true
	}
	t.b[i].Store(tag | m)
	if h.used++; uint64(h.used)*4 > (t.mask+1)*3 {
		h.rebuild(func(e uint64) uint64 { return e })
	}
	return true
}

// clear drops media bits m from every entry (an AllBlocksCleared).
func (h *hints) clear(m uint64) {
	h.rebuild(func(e uint64) uint64 { return e &^ m })
}

// reset empties the index.
func (h *hints) reset() {
	h.live, h.used = 0, 0
	h.cur.Store(newHintTable(minHintBuckets))
}

// rebuild copies the entries that keep media after f into a table sized
// for twice their number, dropping tombstones, and publishes it.
func (h *hints) rebuild(f func(uint64) uint64) {
	old := h.cur.Load()
	live := 0
	for i := range old.b {
		if e := f(old.b[i].Load()); e&mediaMask != 0 {
			live++
		}
	}
	t := newHintTable(2 * live)
	for i := range old.b {
		e := f(old.b[i].Load())
		if e&mediaMask == 0 {
			continue
		}
		j := t.home(e &^ mediaMask)
		for t.b[j].Load() != 0 {
			j = (j + 1) & t.mask
		}
		t.b[j].Store(e)
	}
	h.live, h.used = live, live
	h.cur.Store(t)
}
