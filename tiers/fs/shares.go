package fs

import (
	"fmt"
	"math"

	"github.com/kvtier/kvtier/confvalue"
	"github.com/kvtier/kvtier/keyspace"
	"github.com/kvtier/kvtier/offload"
)

// Shares: the tier's max_bytes divided between tenants, as cpu.Share
// divides the primary. A file's owner is read from its key's tag (package
// keyspace): the share whose space tagged it, else owner 0, the pool of
// untagged keys. Each owner has a quota of bytes, a weight and its own LRU
// list. Eviction for a write takes, file by file, the oldest file of the
// owner furthest above its quota ((held − quota) / weight) and only when
// none is above its quota the writer's own oldest: a tenant within its
// quota never loses a file to another's cascades. When nothing may be
// taken the write fails with ErrFull, like a full tier: the block stays
// in the primary.

// Share is one tenant's part of the tier.
type Share struct {
	// Space is the tenant's keyspace ID (non-zero).
	Space uint64
	// Bytes is its quota: bytes of files no other tenant's writes evict.
	Bytes int64
	// Weight scales how far above its quota it may grow into space no
	// one claims (> 0; 0 means 1).
	Weight float64
}

type shares struct {
	owner  map[uint64]uint8
	quota  []int64
	weight []float64
	used   []int64 // bytes of each owner's live and evicting files

	lastID    uint64
	lastOwner uint8
}

// MaxShares bounds a tier's shares.
const MaxShares = 255

func newShares(list []Share, maxBytes int64) (*shares, error) {
	if len(list) == 0 {
		return nil, nil
	}
	if maxBytes == 0 {
		return nil, fmt.Errorf("tenants' quotas need max_bytes: an unbounded tier evicts nothing")
	}
	if len(list) > MaxShares {
		return nil, fmt.Errorf("%d shares, at most %d", len(list), MaxShares)
	}
	sh := &shares{owner: map[uint64]uint8{}, quota: []int64{0}, weight: []float64{1}}
	var total int64
	for i, s := range list {
		switch {
		case s.Space == 0:
			return nil, fmt.Errorf("share %d: space 0 is the untagged pool", i)
		case s.Bytes < 0:
			return nil, fmt.Errorf("share %d: quota of %d bytes", i, s.Bytes)
		case s.Weight < 0 || math.IsNaN(s.Weight) || math.IsInf(s.Weight, 0):
			return nil, fmt.Errorf("share %d: weight %v, want > 0", i, s.Weight)
		}
		if _, dup := sh.owner[s.Space]; dup {
			return nil, fmt.Errorf("share %d: space listed twice", i)
		}
		if total += s.Bytes; total > maxBytes {
			return nil, fmt.Errorf("the tenants' quotas add up to %s, more than max_bytes = %s", confvalue.ByteSize(total), confvalue.ByteSize(maxBytes))
		}
		w := s.Weight
		if w == 0 {
			w = 1
		}
		sh.owner[s.Space] = uint8(i + 1)
		sh.quota = append(sh.quota, s.Bytes)
		sh.weight = append(sh.weight, w)
	}
	sh.quota[0] = maxBytes - total
	sh.used = make([]int64, len(sh.quota))
	return sh, nil
}

// ownerOf returns the owner of k's file.
func (sh *shares) ownerOf(k offload.Key) uint8 {
	id, ok := keyspace.IDOf(k)
	if !ok {
		return 0
	}
	if id != sh.lastID {
		sh.lastID, sh.lastOwner = id, sh.owner[id]
	}
	return sh.lastOwner
}

// pickVictims is index.pickVictims across the owners: victims from the
// owner furthest above its quota, then the storer's own (storer -1: a
// pass with no writer, over-quota owners only).
func (sh *shares) pickVictims(x *index, need int64, storer int) (victims []int32, freed int64) {
	n := len(sh.quota)
	virt := make([]int64, n)
	cursor := make([]int32, n)
	copy(virt, sh.used)
	copy(cursor, x.tails)
	for freed < need {
		o := -1
		best := 0.0
		for u := range n {
			if cursor[u] == nilIdx || virt[u] <= sh.quota[u] {
				continue
			}
			if over := float64(virt[u]-sh.quota[u]) / sh.weight[u]; o < 0 || over > best {
				o, best = u, over
			}
		}
		if o < 0 {
			if storer < 0 || cursor[storer] == nilIdx {
				break
			}
			o = storer
		}
		// The owner's oldest file without readers.
		i := cursor[o]
		for i != nilIdx && x.ents[i].readers > 0 {
			i = x.ents[i].prev
		}
		if i == nilIdx {
			cursor[o] = nilIdx
			continue
		}
		e := &x.ents[i]
		cursor[o] = e.prev
		x.unlink(i)
		x.live--
		e.state = stateEvicting
		victims = append(victims, i)
		freed += int64(e.size)
		virt[o] -= int64(e.size)
	}
	return victims, freed
}

// storerOf is the owner a write of k evicts for (0 without shares).
func (x *index) storerOf(k offload.Key) int {
	if x.sh == nil {
		return 0
	}
	return int(x.sh.ownerOf(k))
}

// withShares gives the index its shares (before any insert).
func (x *index) withShares(sh *shares) {
	if sh == nil {
		return
	}
	x.sh = sh
	x.heads = make([]int32, len(sh.quota))
	x.tails = make([]int32, len(sh.quota))
	for i := range x.heads {
		x.heads[i], x.tails[i] = nilIdx, nilIdx
	}
}
