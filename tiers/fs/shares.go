package fs

import (
	"fmt"

	"github.com/kvtier/kvtier/confvalue"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/quota"
)

// Shares: the tier's max_bytes divided between tenants by package
// quota's rule, as the primary's slots are. A file's owner is read from
// its key (so it survives restarts), each owner has its own LRU list, and
// a write's eviction asks the table, file by file, whose oldest file to
// take. When nothing may be taken the write fails with ErrFull, like a
// full tier: the block stays in the primary.

type shares struct {
	t    *quota.Table
	used []int64 // bytes of each owner's live and evicting files
}

func newShares(list []quota.Share, maxBytes int64) (*shares, error) {
	if len(list) == 0 {
		return nil, nil
	}
	if maxBytes == 0 {
		return nil, fmt.Errorf("tenants' quotas need max_bytes: an unbounded tier evicts nothing")
	}
	t, err := quota.New(list, maxBytes, func(v int64) string { return confvalue.ByteSize(v).String() })
	if err != nil {
		return nil, err
	}
	return &shares{t: t, used: make([]int64, t.Owners())}, nil
}

// ownerOf returns the owner of k's file.
func (sh *shares) ownerOf(k offload.Key) uint8 { return sh.t.OwnerOf(k) }

// pickVictims is index.pickVictims across the owners: victims from the
// owner furthest above its quota, then the storer's own (storer -1: a
// pass with no writer, over-quota owners only).
func (sh *shares) pickVictims(x *index, need int64, storer int) (victims []int32, freed int64) {
	n := sh.t.Owners()
	virt := make([]int64, n)
	cursor := make([]int32, n)
	exhausted := make([]bool, n)
	copy(virt, sh.used)
	copy(cursor, x.tails)
	for freed < need {
		o := sh.t.Victim(virt, exhausted, storer)
		if o < 0 {
			break
		}
		// The owner's oldest file without readers, not kept.
		i := cursor[o]
		for i != nilIdx && !x.evictable(&x.ents[i]) {
			i = x.ents[i].prev
		}
		if i == nilIdx {
			exhausted[o] = true
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
	x.heads = make([]int32, sh.t.Owners())
	x.tails = make([]int32, sh.t.Owners())
	for i := range x.heads {
		x.heads[i], x.tails[i] = nilIdx, nilIdx
	}
}
