package cpu

// hashIndex is an open-addressing (linear probing) hash table from 64-bit
// hashes to int32 ids. It stores no keys: callers confirm a candidate by
// comparing their own record of the id (the slot's key, or a ghost's full
// hash). Keeping the table this small (8 bytes per bucket) and hashing each
// key exactly once per call is what keeps lookups well under a Go map with
// string keys, and removals use backward-shift deletion so that there are
// no tombstones to clean up.
type hashIndex struct {
	b    []bucket // len is a power of two
	mask uint32
}

// bucket holds the low 32 bits of a hash (which also give the home bucket)
// and an id; id < 0 marks an empty bucket.
type bucket struct {
	h  uint32
	id int32
}

// newHashIndex sizes the table so that n entries keep the load at or below
// num/den.
func newHashIndex(n, num, den int) hashIndex {
	size := 8
	for size*num < n*den {
		size <<= 1
	}
	t := hashIndex{b: make([]bucket, size), mask: uint32(size - 1)}
	t.clear()
	return t
}

func (t *hashIndex) clear() {
	for i := range t.b {
		t.b[i] = bucket{id: -1}
	}
}

// insert adds id under hash h. The caller guarantees the table has room
// (the load bound) and that id is not present.
func (t *hashIndex) insert(h uint64, id int32) {
	h32 := uint32(h)
	i := h32 & t.mask
	for t.b[i].id >= 0 {
		i = (i + 1) & t.mask
	}
	t.b[i] = bucket{h: h32, id: id}
}

// remove deletes id, stored under hash h; it is a no-op if absent.
func (t *hashIndex) remove(h uint64, id int32) {
	h32 := uint32(h)
	i := h32 & t.mask
	for {
		e := t.b[i]
		if e.id < 0 {
			return
		}
		if e.id == id {
			break
		}
		i = (i + 1) & t.mask
	}
	// Backward-shift: pull later entries of the probe run into the hole
	// unless that would move them before their home bucket.
	hole := i
	j := i
	for {
		j = (j + 1) & t.mask
		e := t.b[j]
		if e.id < 0 {
			break
		}
		home := e.h & t.mask
		// e may move into the hole iff home is not cyclically in (hole, j].
		if (j-home)&t.mask >= (j-hole)&t.mask {
			t.b[hole] = e
			hole = j
		}
	}
	t.b[hole] = bucket{id: -1}
}
