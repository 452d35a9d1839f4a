package cpu

import (
	"hash/maphash"

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
	h32  uint32      // low bits of the key's hash, to remove it from the index
	list uint8       // inNoList, inEvictable, inT1 or inT2
}

// free resets m to the free state. It assigns field by field: a
// whole-struct store of a type holding a pointer costs a bulk write
// barrier while the GC runs.
func (m *slotMeta) free() {
	m.key, m.ref, m.mark, m.h32, m.list = "", 0, 0, 0, inNoList
}

// blocks is the state shared by the primary and its policy: the key index
// and the per-slot metadata, both addressed by slot index.
type blocks struct {
	seed  maphash.Seed
	meta  []slotMeta
	links []link
	index hashIndex
}

func newBlocks(numSlots int) blocks {
	b := blocks{
		seed:  maphash.MakeSeed(),
		meta:  make([]slotMeta, numSlots),
		links: make([]link, numSlots),
		// Load ≤ 1/2 keeps probe runs short; buckets are 8 bytes.
		index: newHashIndex(numSlots, 1, 2),
	}
	for i := range b.links {
		b.links[i] = link{-1, -1}
	}
	return b
}

func (b *blocks) hash(k offload.Key) uint64 { return maphash.String(b.seed, string(k)) }

// find returns the slot holding k (whose hash is h), or -1.
func (b *blocks) find(k offload.Key, h uint64) int32 {
	h32 := uint32(h)
	t := &b.index
	for i := h32 & t.mask; ; i = (i + 1) & t.mask {
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
