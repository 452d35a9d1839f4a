package quota

import (
	"errors"
	"fmt"
	"math"

	"github.com/kvtier/kvtier/keyspace"
	"github.com/kvtier/kvtier/offload"
)

// MaxShares bounds the shares of a Table (owner 0 not counted): owners
// are uint8.
const MaxShares = 255

// Share is one owner's part of a capacity.
type Share struct {
	// Space is the keyspace ID of the owner's keys (non-zero).
	Space uint64
	// Quota is what no other owner's store evicts, in the capacity's unit.
	Quota int64
	// Weight scales how far above its quota the owner may stay before
	// another's store evicts it, relative to the others (> 0; 0 means 1).
	Weight float64
}

// ErrOverCommitted reports quotas that add up to more than the capacity:
// a quota is a guarantee the capacity could not keep.
var ErrOverCommitted = errors.New("quotas add up to more than the capacity")

// Table is a capacity divided between owners.
type Table struct {
	owner  map[uint64]uint8 // space → owner
	quota  []int64
	weight []float64
	spaces []uint64

	// The last space OwnerOf looked up, and its owner: the keys of one
	// call are nearly always one owner's.
	lastID    uint64
	lastOwner uint8
}

// New validates list for a capacity of capacity units; unit renders an
// amount in error messages.
func New(list []Share, capacity int64, unit func(int64) string) (*Table, error) {
	if len(list) > MaxShares {
		return nil, fmt.Errorf("%d shares, at most %d", len(list), MaxShares)
	}
	t := &Table{owner: make(map[uint64]uint8, len(list)), quota: []int64{0}, weight: []float64{1}, spaces: []uint64{0}}
	var total int64
	for i, s := range list {
		switch {
		case s.Space == 0:
			return nil, fmt.Errorf("share %d: space 0 is the untagged pool", i)
		case s.Quota < 0:
			return nil, fmt.Errorf("share %d: quota of %s", i, unit(s.Quota))
		case s.Weight < 0 || math.IsNaN(s.Weight) || math.IsInf(s.Weight, 0):
			return nil, fmt.Errorf("share %d: weight %v, want > 0", i, s.Weight)
		}
		if _, dup := t.owner[s.Space]; dup {
			return nil, fmt.Errorf("share %d: space %#x listed twice", i, s.Space)
		}
		if total += s.Quota; total > capacity {
			return nil, fmt.Errorf("%w: %s, capacity %s", ErrOverCommitted, unit(total), unit(capacity))
		}
		w := s.Weight
		if w == 0 {
			w = 1
		}
		t.owner[s.Space] = uint8(i + 1)
		t.quota = append(t.quota, s.Quota)
		t.weight = append(t.weight, w)
		t.spaces = append(t.spaces, s.Space)
	}
	t.quota[0] = capacity - total
	return t, nil
}

// Owners returns the number of owners, the pool included.
func (t *Table) Owners() int { return len(t.quota) }

// Quota returns owner o's quota.
func (t *Table) Quota(o int) int64 { return t.quota[o] }

// Space returns owner o's keyspace ID (0 for the pool).
func (t *Table) Space(o int) uint64 { return t.spaces[o] }

// Report is what each owner holds (held, by owner) beside its quota, for
// a tier's offload.TierReport.
func (t *Table) Report(held []int64) []offload.ShareReport {
	out := make([]offload.ShareReport, len(held))
	for o, h := range held {
		out[o] = offload.ShareReport{Space: t.spaces[o], Bytes: h, Quota: t.quota[o]}
	}
	return out
}

// OwnerOfSpace returns the owner of the keys of space id (0 when no share
// names it). Unlike OwnerOf it keeps no cache: it is safe for concurrent
// use.
func (t *Table) OwnerOfSpace(id uint64) uint8 { return t.owner[id] }

// OwnerOf returns the owner of key k.
func (t *Table) OwnerOf(k offload.Key) uint8 {
	id, ok := keyspace.IDOf(k)
	if !ok {
		return 0
	}
	if id != t.lastID {
		t.lastID, t.lastOwner = id, t.owner[id] // 0 when no share names the space
	}
	return t.lastOwner
}

// Victim returns the owner to take the next victim of a store by storer
// from (storer -1: an eviction with no store, which takes from owners
// above their quota only), given what each owner holds less the victims
// already taken (held) and which owners have no candidate left
// (exhausted). It returns -1 when no owner may give one.
func (t *Table) Victim(held []int64, exhausted []bool, storer int) int {
	best, bestOver := -1, 0.0
	for o, h := range held {
		if h <= t.quota[o] || exhausted[o] {
			continue
		}
		if over := float64(h-t.quota[o]) / t.weight[o]; best < 0 || over > bestOver {
			best, bestOver = o, over
		}
	}
	if best < 0 && storer >= 0 && !exhausted[storer] {
		best = storer
	}
	return best
}
