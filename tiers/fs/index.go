package fs

import (
	"slices"

	"github.com/kvtier/kvtier/offload"
)

const nilIdx int32 = -1

// Entry states.
const (
	stateFree     uint8 = iota // on the free list
	stateLive                  // file on disk, readable, in the LRU list
	stateEvicting              // chosen for eviction: still mapped, not in the LRU list
	stateDoomed                // unmapped (deleted); the slot waits for its readers
)

// entry is the index metadata of one block file, 32 bytes. Blocks are far
// below 4 GiB, so the size fits a uint32 (bigger files are ignored).
type entry struct {
	key     offload.Key
	size    uint32
	prev    int32 // towards the most recently used end
	next    int32 // towards the least recently used end; free-list link when free
	readers uint16
	state   uint8
	owner   uint8 // the tenant's share the file counts against (shares.go); 0 without
}

// maxReaders bounds concurrent loads of one file (the read pool is at
// most 4096 workers, so this is never reached in practice).
const maxReaders = 1<<16 - 1

// index is the tier's in-memory view of its files: key → entry, an LRU
// list and the bytes used. Entries live in one slice linked by int32
// indices to keep them small and pointer-free apart from the key. It is
// not safe for concurrent use; the tier guards it with its mutex.
type index struct {
	ents  []entry
	byKey map[offload.Key]int32
	// heads and tails are each owner's LRU list (one list without
	// shares): most and least recently used.
	heads, tails []int32
	free         int32
	used         int64 // bytes of live and evicting files
	live         int
	sh           *shares // nil without tenants' shares
	// keep reports blocks no eviction may choose (pinned by routers:
	// offload.Keeper); nil keeps none.
	keep func(offload.Key) bool
}

// evictable reports whether e may be chosen as a victim: nobody reads it
// and it is not kept.
func (x *index) evictable(e *entry) bool {
	return e.readers == 0 && (x.keep == nil || !x.keep(e.key))
}

func newIndex() index {
	return index{byKey: make(map[offload.Key]int32), heads: []int32{nilIdx}, tails: []int32{nilIdx}, free: nilIdx}
}

// find returns the entry of k if it is mapped (live or evicting).
func (x *index) find(k offload.Key) (int32, bool) {
	i, ok := x.byKey[k]
	return i, ok
}

// mapped returns the keys that are mapped, in order; keys itself when all
// of them are.
func (x *index) mapped(keys []offload.Key) []offload.Key {
	for i, k := range keys {
		if _, ok := x.byKey[k]; ok {
			continue
		}
		out := slices.Clone(keys[:i])
		for _, k := range keys[i+1:] {
			if _, ok := x.byKey[k]; ok {
				out = append(out, k)
			}
		}
		return out
	}
	return keys
}

func (x *index) alloc() int32 {
	if x.free != nilIdx {
		i := x.free
		x.free = x.ents[i].next
		return i
	}
	x.ents = append(x.ents, entry{})
	return int32(len(x.ents) - 1)
}

func (x *index) release(i int32) {
	x.ents[i] = entry{next: x.free}
	x.free = i
}

func (x *index) pushFront(i int32) {
	e := &x.ents[i]
	o := e.owner
	e.prev, e.next = nilIdx, x.heads[o]
	if x.heads[o] != nilIdx {
		x.ents[x.heads[o]].prev = i
	}
	x.heads[o] = i
	if x.tails[o] == nilIdx {
		x.tails[o] = i
	}
}

func (x *index) unlink(i int32) {
	e := &x.ents[i]
	o := e.owner
	if e.prev != nilIdx {
		x.ents[e.prev].next = e.next
	} else {
		x.heads[o] = e.next
	}
	if e.next != nilIdx {
		x.ents[e.next].prev = e.prev
	} else {
		x.tails[o] = e.prev
	}
	e.prev, e.next = nilIdx, nilIdx
}

// insert maps k to a live file of size bytes at the MRU end. k must not
// be mapped.
func (x *index) insert(k offload.Key, size int64) int32 {
	i := x.alloc()
	x.ents[i] = entry{key: k, size: uint32(size), state: stateLive}
	if x.sh != nil {
		o := x.sh.ownerOf(k)
		x.ents[i].owner = o
		x.sh.used[o] += size
	}
	x.pushFront(i)
	x.byKey[k] = i
	x.used += size
	x.live++
	return i
}

// touch moves a live entry to the MRU end.
func (x *index) touch(i int32) {
	if x.ents[i].state != stateLive || x.heads[x.ents[i].owner] == i {
		return
	}
	x.unlink(i)
	x.pushFront(i)
}

// acquire registers a reader of k's file; false when k is not live or the
// reader count is saturated.
func (x *index) acquire(k offload.Key) (int32, bool) {
	i, ok := x.byKey[k]
	if !ok {
		return nilIdx, false
	}
	e := &x.ents[i]
	if e.state != stateLive || e.readers == maxReaders {
		return nilIdx, false
	}
	e.readers++
	return i, true
}

// done unregisters a reader; the slot of a doomed entry is freed with its
// last reader.
func (x *index) done(i int32) {
	e := &x.ents[i]
	e.readers--
	if e.readers == 0 && e.state == stateDoomed {
		x.release(i)
	}
}

// drop unmaps entry i (its file was deleted or vanished). Readers keep the
// slot until they are done.
func (x *index) drop(i int32) {
	e := &x.ents[i]
	if e.state == stateLive {
		x.unlink(i)
		x.live--
	}
	if x.byKey[e.key] == i {
		delete(x.byKey, e.key)
	}
	x.used -= int64(e.size)
	if x.sh != nil {
		x.sh.used[e.owner] -= int64(e.size)
	}
	if e.readers == 0 {
		x.release(i)
		return
	}
	e.state = stateDoomed
}

// pickVictims marks least-recently-used live files without readers (and
// not kept) as evicting until at least need bytes are chosen, and returns
// them. It may return fewer bytes when the rest is being read or kept. With shares it chooses
// across the owners (shares.go) for a store of storer's (-1: none).
func (x *index) pickVictims(need int64, storer int) (victims []int32, freed int64) {
	if x.sh != nil {
		return x.sh.pickVictims(x, need, storer)
	}
	for i := x.tails[0]; i != nilIdx && freed < need; {
		e := &x.ents[i]
		prev := e.prev
		if x.evictable(e) {
			x.unlink(i)
			x.live--
			e.state = stateEvicting
			victims = append(victims, i)
			freed += int64(e.size)
		}
		i = prev
	}
	return victims, freed
}

// unevict puts an entry whose deletion failed back at the LRU end.
func (x *index) unevict(i int32) {
	e := &x.ents[i]
	o := e.owner
	e.state = stateLive
	x.live++
	e.prev, e.next = x.tails[o], nilIdx
	if x.tails[o] != nilIdx {
		x.ents[x.tails[o]].next = i
	}
	x.tails[o] = i
	if x.heads[o] == nilIdx {
		x.heads[o] = i
	}
}
