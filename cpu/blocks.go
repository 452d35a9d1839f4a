package cpu

import (
	"hash/maphash"
	"math/bits"
	"math/rand/v2"
	"unsafe"

	"github.com/kvtier/kvtier/offload"
)

// Where a slot's block sits in its policy's lists.
const (
	inNoList    uint8 = iota
	inEvictable       // LRU: the evictable list
	inT1              // ARC: recent
	inT2              // ARC: frequent
)

// slotMeta is the per-slot block state: 32 bytes on 64-bit platforms.
// A slot with an empty key and ref 0 is free.
type slotMeta struct {
	key  offload.Key // "" when the slot is free
	ref  int32       // -1 pending, 0 ready and evictable, > 0 pinned by readers
	mark uint32      // epoch of the last call that protected or visited it
	h32  uint32      // low bits of the key's hash: its index tag and ghost identity
	list uint8       // inNoList, inEvictable, inT1 or inT2
	// owner is the share holding the slot (shares.go); 0 without shares.
	owner uint8
	// soft counts the pins of ref that are soft (cascades): a block held
	// by soft pins only keeps its place in the policy's lists, and
	// eviction may ask the Revoker to release them.
	soft uint16
}

// free resets m to the free state. It assigns field by field: a
// whole-struct store of a type holding a pointer costs a bulk write
// barrier while the GC runs.
func (m *slotMeta) free() {
	m.key, m.ref, m.mark, m.h32, m.list, m.soft, m.owner = "", 0, 0, 0, inNoList, 0, 0
}

// blocks is the state shared by the primary and its policy: the key index
// and the per-slot metadata, both addressed by slot index.
type blocks struct {
	seed  [4]uint64 // of hash, random per Primary
	short maphash.Seed
	meta  []slotMeta
	links []link
	index hashIndex
	// gen counts, per slot, the blocks it has been given, modulo 2^16 (2
	// bytes a slot): a slot's bytes are only ever rewritten for another
	// block, so (slot, gen) names one block's bytes (Primary.SlotGen).
	gen []uint16

	hashes []uint64 // scratch of resolve
	slots  []int32
}

// Index loads: the lower the load, the shorter the probe runs that a
// store walks three times per key (the new key's miss and insertion, the
// victim's removal) — a store with eviction costs ~25 % less at 1/4 than
// at 2/5 — but the larger the index. LRU takes 1/4 (32 bytes per slot,
// 72 in all); ARC, whose ghosts cost 32 bytes per slot more, takes 2/5
// (20 bytes per slot, 92 in all) to stay within 96 bytes per slot.
const (
	lruLoadNum, lruLoadDen = 1, 4
	arcLoadNum, arcLoadDen = 2, 5
)

// newBlocks allocates the metadata of numSlots slots with an index at a
// load of at most num/den.
func newBlocks(numSlots, num, den int) blocks {
	b := blocks{
		seed:  [4]uint64{rand.Uint64(), rand.Uint64(), rand.Uint64(), rand.Uint64()},
		short: maphash.MakeSeed(),
		meta:  make([]slotMeta, numSlots),
		links: make([]link, numSlots),
		index: newHashIndex(numSlots, num, den),
		gen:   make([]uint16, numSlots),
	}
	for i := range b.links {
		b.links[i] = link{-1, -1}
	}
	return b
}

// le64 reads the little-endian uint64 at s[i:i+8]; the compiler turns it
// into one load.
func le64(s offload.Key, i int) uint64 {
	s = s[i : i+8]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}

// hash returns k's 64-bit hash, seeded per Primary.
//
// It is a multiply-mix over the whole key in the style of wyhash (the
// runtime's own map hash where AES is not available), specialised for
// keys of up to 48 bytes — a 32-byte block hash and a 4-byte group, or a
// 16-byte one — which it hashes with three 64×64→128-bit multiplications,
// two of them independent, inlined: several times cheaper than a
// hash/maphash call. The random seed keeps colliding keys from being
// prepared in advance. Keys shorter than 8 bytes (not engine keys) go to
// maphash.
func (b *blocks) hash(k offload.Key) uint64 {
	n := len(k)
	switch {
	case n < 8:
		return maphash.String(b.short, string(k))
	case n <= 16:
		return mix(le64(k, 0)^b.seed[0], le64(k, n-8)^b.seed[1]^uint64(n))
	case n <= 48:
		// Two lanes over the first 32 bytes (overlapping for shorter
		// keys), folded into a mix of the last 16.
		x := mix(le64(k, 0)^b.seed[0], le64(k, 8)^b.seed[2])
		y := mix(le64(k, min(16, n-16))^b.seed[1], le64(k, min(24, n-8))^b.seed[3])
		return mix(le64(k, n-16)^x^uint64(n), le64(k, n-8)^y)
	}
	return b.hashLong(k)
}

// hashLong hashes keys over 48 bytes, 16 bytes per step.
func (b *blocks) hashLong(k offload.Key) uint64 {
	n := len(k)
	h := b.seed[2] ^ uint64(n)
	for i := 0; n-i > 16; i += 16 {
		h = mix(le64(k, i)^b.seed[0], le64(k, i+8)^h)
	}
	return mix(le64(k, n-16)^b.seed[1], le64(k, n-8)^h^b.seed[3])
}

func mix(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	return hi ^ lo
}

// find returns the slot holding k (whose hash is h), or -1.
func (b *blocks) find(k offload.Key, h uint64) int32 {
	h32 := uint32(h)
	t := &b.index
	for i := t.home(h32); ; i = t.next(i) {
		e := t.b[i]
		if e.id < 0 {
			return -1
		}
		if e.h == h32 && b.meta[e.id].key == k {
			return e.id
		}
	}
}

func (b *blocks) lookup(k offload.Key) int32 { return b.find(k, b.hash(k)) }

// resolve returns the slots of keys (-1 for an absent key) and records
// their hashes in b.hashes, both in scratch reused by the next call. The
// keys are hashed in one pass and looked up in another: the lookups do
// not depend on each other, so their cache misses overlap.
func (b *blocks) resolve(keys []offload.Key) []int32 {
	b.hashes, b.slots = b.hashes[:0], b.slots[:0]
	for _, k := range keys {
		b.hashes = append(b.hashes, b.hash(k))
	}
	for i, k := range keys {
		b.slots = append(b.slots, b.find(k, b.hashes[i]))
	}
	return b.slots
}

// sameKey is a == b, answering without a call into the runtime when both
// are the same string: the manager passes back the very strings it
// stored, so this is the common case of the last-batch hint.
func sameKey(a, b offload.Key) bool {
	return len(a) == len(b) && (unsafe.StringData(string(a)) == unsafe.StringData(string(b)) || a == b)
}

// add indexes slot s, whose key hashes to h, and records its tag.
func (b *blocks) add(s int32, h uint64) {
	b.meta[s].h32 = uint32(h)
	b.index.insert(uint32(h), s)
}
