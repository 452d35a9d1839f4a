package peer

import (
	"context"
	"time"

	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/offload"
)

// streamLoad reads job.Keys[idx] over the block stream straight into
// their slots. ok[i] is set for the blocks that arrived whole and
// verified; gone lists the others. A transport error fails the rest.
func (t *Tier) streamLoad(ctx context.Context, p *peer, sc *client.Stream, job *offload.Job, idx []int, ok []bool) (gone []offload.Key, err error) {
	keys := make([]offload.Key, len(idx))
	for j, i := range idx {
		keys[j] = job.Keys[i]
	}
	deadline := time.Now().Add(t.cfg.Timeout)
	if d, has := ctx.Deadline(); has && d.Before(deadline) {
		deadline = d
	}
	res, err := sc.Get(keys, func(j int) []byte {
		slot, serr := job.Arena.Slot(job.Slots[idx[j]])
		if serr != nil {
			return nil // a wrong size: skipped, never written
		}
		return slot
	}, deadline)
	if err != nil {
		sc.Close()
	} else {
		p.c.Streams().Give(sc)
	}
	for j, r := range res {
		switch r {
		case client.StreamLoaded:
			ok[idx[j]] = true
			p.served.Add(1)
		case client.StreamCorrupt:
			p.corrupt.Add(1)
			gone = append(gone, keys[j])
		default:
			gone = append(gone, keys[j])
		}
	}
	return gone, err
}
