package memory

import (
	"fmt"
	"slices"

	"github.com/kvtier/kvtier/confvalue"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/quota"
)

// Shares: the tier's capacity_blocks divided between tenants by package
// quota's rule, as the primary's slots and an fs tier's bytes are. A
// block's owner is read from its key, each owner has its own LRU list,
// and a store's eviction asks the table, block by block, whose oldest
// block to take. When nothing may be taken the store fails with ErrFull:
// the block stays in the primary. Every method is nil-safe: a nil
// *shares is the tier without tenants (one owner, 0).

type shares struct {
	t          *quota.Table
	blockBytes int64
	held       []int64 // bytes of each owner's blocks
}

// newShares divides capacityBlocks blocks of blockBytes between list,
// whose quotas in bytes are rounded down to whole blocks.
func newShares(list []quota.Share, capacityBlocks, blockBytes int) (*shares, error) {
	switch {
	case len(list) == 0:
		return nil, nil
	case capacityBlocks == 0:
		return nil, fmt.Errorf("tenants' quotas need capacity_blocks: an unbounded tier evicts nothing")
	case blockBytes <= 0:
		return nil, fmt.Errorf("tenants' quotas need the block size (the namespace's bytes_per_block), got %d", blockBytes)
	}
	bb := int64(blockBytes)
	qs := slices.Clone(list)
	for i := range qs {
		qs[i].Quota = qs[i].Quota / bb * bb
	}
	t, err := quota.New(qs, int64(capacityBlocks)*bb, func(v int64) string { return confvalue.ByteSize(v).String() })
	if err != nil {
		return nil, err
	}
	return &shares{t: t, blockBytes: bb, held: make([]int64, t.Owners())}, nil
}

// owners returns the number of recency lists the tier keeps.
func (sh *shares) owners() int {
	if sh == nil {
		return 1
	}
	return sh.t.Owners()
}

// ownerOf returns the owner of k's block.
func (sh *shares) ownerOf(k offload.Key) uint8 {
	if sh == nil {
		return 0
	}
	return sh.t.OwnerOf(k)
}

// hold and release count a block of o's in and out.
func (sh *shares) hold(o uint8) {
	if sh != nil {
		sh.held[o] += sh.blockBytes
	}
}

func (sh *shares) release(o uint8) {
	if sh != nil {
		sh.held[o] -= sh.blockBytes
	}
}

// victim returns the owner whose oldest block a store of storer's evicts
// next, -1 for none (every other owner within its quota, the storer's
// list empty).
func (sh *shares) victim(exhausted []bool, storer int) int {
	return sh.t.Victim(sh.held, exhausted, storer)
}

func (sh *shares) clear() {
	if sh != nil {
		clear(sh.held)
	}
}

// report is each owner's bytes and quota.
func (sh *shares) report() []offload.ShareReport {
	if sh == nil {
		return nil
	}
	return sh.t.Report(sh.held)
}
