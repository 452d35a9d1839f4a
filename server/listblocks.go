package server

import (
	"context"
	"fmt"

	kvtierv1 "github.com/kvtier/kvtier/api/kvtier/v1"
	"github.com/kvtier/kvtier/offload"
)

// EventFeed says where a namespace's KV events are published, for peers
// that index this daemon from its events (ListBlocks).
type EventFeed struct {
	// NextSeq is the sequence number of the next batch.
	NextSeq uint64
	// Port and ReplayPort are the bound TCP ports (0 = none).
	Port, ReplayPort int
	Topic            string
	// CPUMedium is the wire name of the primary's medium.
	CPUMedium string
}

// ListBlocks returns one page of the primary's ready keys from cursor on,
// at most limit (bounded by Limits.MaxKeysPerCall), the cursor of the
// next page (0 at the end) and the event feed as it stood when the page
// was read.
func (ns *Namespace) ListBlocks(cursor int64, limit int) ([]offload.Key, int64, EventFeed, error) {
	if ns.blocks == nil {
		return nil, 0, EventFeed{}, fmt.Errorf("%w: namespace %q cannot list its blocks", ErrProtocol, ns.name)
	}
	if cursor < 0 {
		return nil, 0, EventFeed{}, fmt.Errorf("%w: cursor %d is negative", ErrInvalidArgument, cursor)
	}
	if limit <= 0 || limit > ns.limits.MaxKeysPerCall {
		limit = ns.limits.MaxKeysPerCall
	}
	if err := ns.lock(); err != nil {
		return nil, 0, EventFeed{}, err
	}
	defer ns.mu.Unlock()
	keys, next := ns.blocks(cursor, limit, make([]offload.Key, 0, min(limit, ns.arena.NumSlots())))
	var f EventFeed
	if ns.feed != nil {
		f = ns.feed()
	}
	return keys, next, f, nil
}

func (sv *service) ListBlocks(ctx context.Context, in *kvtierv1.ListBlocksRequest) (*kvtierv1.ListBlocksResponse, error) {
	ns, _, err := sv.openAdmin(ctx, in.GetNamespace())
	if err != nil {
		return nil, err
	}
	keys, next, f, err := ns.ListBlocks(in.GetCursor(), int(in.GetLimit()))
	if err != nil {
		return nil, toStatus(err)
	}
	out := &kvtierv1.ListBlocksResponse{
		Keys:             make([][]byte, len(keys)),
		NextCursor:       next,
		EventsNextSeq:    f.NextSeq,
		EventsPort:       int32(f.Port),
		EventsReplayPort: int32(f.ReplayPort),
		EventsTopic:      f.Topic,
		EventsCpuMedium:  f.CPUMedium,
	}
	for i, k := range keys {
		out.Keys[i] = []byte(k)
	}
	return out, nil
}
