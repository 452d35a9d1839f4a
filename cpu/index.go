package cpu

// hashIndex is an open-addressing (linear probing) hash table from 32-bit
// hash tags to int32 ids. It stores no keys: callers confirm a candidate by
// comparing their own record of the id (the slot's key, or a tracked
// entry's full hash). Keeping the table this small (8 bytes per bucket)
// and hashing each key once per call is what keeps lookups well under a Go
// map with string keys, and removals use backward-shift deletion so that
// there are no tombstones to clean up.
//
// The table has exactly as many buckets as its load bound needs (not a
// power of two): the home bucket of a tag is its fixed-point product with
// the size (Lemire's multiply-shift range reduction), which costs one
// multiplication and keeps metadata from doubling at unlucky sizes.
type hashIndex struct {
	b []bucket
	n uint64 // len(b)
}

// bucket holds a 32-bit hash tag (which also gives the home bucket) and an
// id; id < 0 marks an empty bucket.
type bucket struct {
	h  uint32
	id int32
}

// tableSize returns the number of buckets that keeps n entries at a load
// of at most num/den, and at least 8.
func tableSize(n, num, den int) int {
	return max(8, (n*den+num-1)/num)
}

// newHashIndex sizes the table so that n entries keep the load at or below
// num/den.
func newHashIndex(n, num, den int) hashIndex {
	size := tableSize(n, num, den)
	t := hashIndex{b: make([]bucket, size), n: uint64(size)}
	t.clear()
	return t
}

// home returns the first bucket probed for tag h32: uniform over [0, n)
// when h32 is uniform over 32 bits.
func (t *hashIndex) home(h32 uint32) uint32 { return uint32(uint64(h32) * t.n >> 32) }

// next returns the bucket after i, wrapping around.
func (t *hashIndex) next(i uint32) uint32 {
	if i++; uint64(i) == t.n {
		return 0
	}
	return i
}

// dist is the cyclic distance from bucket a forward to bucket b.
func (t *hashIndex) dist(a, b uint32) uint32 {
	if b >= a {
		return b - a
	}
	return b + uint32(t.n) - a
}

func (t *hashIndex) clear() {
	for i := range t.b {
		t.b[i] = bucket{id: -1}
	}
}

// insert adds id under tag h32. The caller guarantees the table has room
// (the load bound) and that id is absent.
func (t *hashIndex) insert(h32 uint32, id int32) {
	i := t.home(h32)
	for t.b[i].id >= 0 {
		i = t.next(i)
	}
	t.b[i] = bucket{h: h32, id: id}
}

// remove deletes id, stored under tag h32; it is a no-op if absent.
func (t *hashIndex) remove(h32 uint32, id int32) {
	i := t.home(h32)
	for {
		e := t.b[i]
		if e.id < 0 {
			return
		}
		if e.id == id {
			break
		}
		i = t.next(i)
	}
	// Backward-shift: pull later entries of the probe run into the hole
	// unless that would move them before their home bucket.
	hole := i
	j := i
	for {
		j = t.next(j)
		e := t.b[j]
		if e.id < 0 {
			break
		}
		// e may move into the hole iff its home is not cyclically in
		// (hole, j].
		if t.dist(t.home(e.h), j) >= t.dist(hole, j) {
			t.b[hole] = e
			hole = j
		}
	}
	t.b[hole] = bucket{id: -1}
}
