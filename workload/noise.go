package workload

import (
	"fmt"
	"strconv"

	"github.com/kvtier/kvtier/cpu"
	"github.com/kvtier/kvtier/keyspace"
	"github.com/kvtier/kvtier/offload"
)

// Noise replays the trace as one tenant while a noisy neighbour, a second
// tenant of the same primary, stores blocks that no one ever reads (a
// flood of one-off prompts): the noisy-neighbour benchmark of tenants'
// quotas. The trace's keys are in key space "trace", the neighbour's in
// "noise" (package keyspace), so the two never share a block.
type Noise struct {
	// BlocksPerRequest is how many new blocks the neighbour stores after
	// each request of the trace (> 0).
	BlocksPerRequest int
	// TraceQuota, when > 0, divides the primary into shares (cpu.Share):
	// the trace's tenant is guaranteed TraceQuota blocks, the neighbour
	// the rest. 0 runs both tenants through one eviction order, as a
	// primary without tenants would.
	TraceQuota int
}

// NoiseResult is what the neighbour did.
type NoiseResult struct {
	BlocksPerRequest int    `json:"blocks_per_request"`
	TraceQuota       int    `json:"trace_quota"`
	StoredBlocks     uint64 `json:"stored_blocks"`
	RejectedStores   uint64 `json:"rejected_stores"`
	// TraceEvictedByNoise counts the trace's blocks the neighbour's
	// stores evicted (with quotas: only while the trace's tenant held
	// more than its quota).
	TraceEvictedByNoise uint64 `json:"trace_evicted_by_noise"`
}

var traceSpace, noiseSpace = mustSpace("trace"), mustSpace("noise")

func mustSpace(name string) keyspace.Space {
	s, err := keyspace.New(name)
	if err != nil {
		panic(err) // a constant name
	}
	return s
}

func (n *Noise) check(primaryBlocks int) error {
	switch {
	case n.BlocksPerRequest <= 0:
		return fmt.Errorf("workload: noise of %d blocks per request: want > 0", n.BlocksPerRequest)
	case n.TraceQuota < 0 || n.TraceQuota > primaryBlocks:
		return fmt.Errorf("workload: the trace's quota of %d blocks: want 0 to the primary's %d", n.TraceQuota, primaryBlocks)
	}
	return nil
}

// shares are the primary's shares of a noisy replay (nil without quotas).
func (n *Noise) shares(primaryBlocks int) []cpu.Share {
	if n == nil || n.TraceQuota == 0 {
		return nil
	}
	return []cpu.Share{
		{Space: traceSpace.ID(), Slots: n.TraceQuota},
		{Space: noiseSpace.ID(), Slots: primaryBlocks - n.TraceQuota},
	}
}

// keyOf is KeyOf in the trace's key space when the replay has noise.
func (d *driver) keyOf(id uint64) offload.Key {
	k := KeyOf(id)
	if d.opts.Noise != nil {
		return traceSpace.Key([]byte(k))
	}
	return k
}

// noise stores the neighbour's blocks after a request of the trace.
func (d *driver) noise() error {
	n := d.opts.Noise
	if n == nil {
		return nil
	}
	m := d.m
	rc := new(offload.ReqContext)
	*rc = *d.tmpl
	d.noiseSeq++
	rc.ID = "noise" + strconv.FormatUint(d.noiseSeq, 10)
	m.OnNewRequest(rc)
	keys := make([]offload.Key, n.BlocksPerRequest)
	for i := range keys {
		d.noiseKey++
		keys[i] = noiseSpace.Key([]byte(KeyOf(d.noiseKey)))
	}
	ps, ok, err := m.PrepareStore(keys, rc)
	if err != nil {
		return err
	}
	if !ok {
		d.noiseRes.RejectedStores++
	} else if len(ps.KeysToStore) > 0 {
		for _, k := range ps.Evicted {
			if _, ok := traceSpace.Strip(k); ok {
				d.noiseRes.TraceEvictedByNoise++
			}
		}
		if err := m.CompleteStore(ps.KeysToStore, rc, true); err != nil {
			return err
		}
		d.noiseRes.StoredBlocks += uint64(len(ps.KeysToStore))
	}
	m.OnRequestFinished(rc)
	return nil
}
