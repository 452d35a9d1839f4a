package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	kvtierv1 "github.com/kvtier/kvtier/api/kvtier/v1"
	"github.com/kvtier/kvtier/blockstream"
	"github.com/kvtier/kvtier/offload"
)

// The by-value calls. Over TCP they take the daemon's block stream when it
// has one (connections from the client's StreamPool): blocks go
// from the caller's buffers into the socket and from the socket into the
// caller's buffers, checksummed, instead of through the API's messages.
// Calls the stream cannot carry (an active request id, GetOptions
// Checksums) use the API, and so does a call whose stream fails before it
// is answered, or that a block damaged on the way (a put sends only the
// damaged blocks again): the stream is a faster path, never a different
// answer. (If a put's stream fails after the daemon stored its blocks,
// the API then finds them present.)

// Block is a key and its bytes, and optionally (puts) its tokens for
// self-describing KV events.
type Block struct {
	Key  offload.Key
	Data []byte
	Meta *kvtierv1.BlockMetadata
}

// CallOptions name the request a by-value call runs for: an active
// request id, or (RequestID "") a temporary request built from Params.
type CallOptions struct {
	RequestID string
	Params    string
}

// streamCallTimeout bounds a by-value call on the stream whose context
// has no deadline.
const streamCallTimeout = 2 * time.Minute

// onStream runs call on a pooled stream with ctx's deadline (ends the
// stream's I/O when ctx ends). used is false when the call should go to
// the API instead: no stream, or the stream failed before the call was
// answered (and ctx is still live).
func (c *Client) onStream(ctx context.Context, call func(s *Stream, slotSize int, deadline time.Time) error) (used bool, err error) {
	s, size := c.streams.Take(ctx)
	if s == nil {
		return false, nil
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(streamCallTimeout)
	}
	stop := context.AfterFunc(ctx, func() { _ = s.c.SetDeadline(time.Now()) })
	err = call(s, size, deadline)
	stopped := stop()
	var answered *answerError
	switch {
	case err == nil, errors.As(err, &answered):
		if stopped {
			c.streams.Give(s)
		} else {
			s.Close()
		}
		if answered != nil {
			err = answered.err
		}
		return true, err
	case ctx.Err() != nil:
		s.Close()
		return true, ctx.Err()
	default:
		s.Close() // a transport failure: the stream is out of step
		return false, nil
	}
}

// answerError is the daemon's answer to a call on the stream (the stream
// stays usable), as opposed to a failure of the stream itself.
type answerError struct{ err error }

func (e *answerError) Error() string { return e.err.Error() }

// PutBlocks stores blocks by value (each exactly the daemon's slot size).
// stored[i] is true when blocks[i] was written, false when it was already
// present.
func (c *Client) PutBlocks(ctx context.Context, blocks []Block, o CallOptions) (stored []bool, err error) {
	if o.RequestID == "" && len(blocks) > 0 && len(o.Params) < 1<<16 {
		var damaged []int
		used, err := c.onStream(ctx, func(s *Stream, slotSize int, deadline time.Time) error {
			var serr error
			stored, damaged, serr = putOnStream(s, slotSize, blocks, o.Params, deadline)
			return serr
		})
		switch {
		case !used:
		case err != nil || len(damaged) == 0:
			return stored, err
		default:
			// Blocks damaged on the way were not stored: send them again
			// through the API.
			again := make([]Block, len(damaged))
			for j, i := range damaged {
				again[j] = blocks[i]
			}
			st, err := c.putAPI(ctx, again, o)
			if err != nil {
				return nil, err
			}
			for j, i := range damaged {
				stored[i] = st[j]
			}
			return stored, nil
		}
	}
	return c.putAPI(ctx, blocks, o)
}

func (c *Client) putAPI(ctx context.Context, blocks []Block, o CallOptions) ([]bool, error) {
	in := &kvtierv1.PutBlocksRequest{Namespace: c.ns, RequestId: o.RequestID, KvTransferParams: o.Params, Blocks: make([]*kvtierv1.Block, len(blocks))}
	for i, b := range blocks {
		in.Blocks[i] = &kvtierv1.Block{Key: []byte(b.Key), Data: b.Data, Metadata: b.Meta}
	}
	resp, err := c.api.PutBlocks(ctx, in)
	if err != nil {
		return nil, err
	}
	stored := make([]bool, len(resp.GetStatuses()))
	for i, s := range resp.GetStatuses() {
		stored[i] = s == kvtierv1.PutStatus_PUT_STATUS_STORED
	}
	return stored, nil
}

// putOnStream is PutBlocks on the stream; damaged lists the blocks that
// failed their checksum on the way and were not stored. The API's
// refusals of its arguments are made here, with the API's codes, before
// anything is sent.
func putOnStream(s *Stream, slotSize int, blocks []Block, params string, deadline time.Time) (stored []bool, damaged []int, err error) {
	seen := make(map[offload.Key]int, len(blocks))
	for i, b := range blocks {
		if len(b.Data) != slotSize {
			return nil, nil, &answerError{status.Errorf(codes.InvalidArgument, "blocks[%d]: data is %d bytes, slot size is %d", i, len(b.Data), slotSize)}
		}
		if j, dup := seen[b.Key]; dup {
			return nil, nil, &answerError{status.Errorf(codes.InvalidArgument, "blocks[%d]: key %s repeats blocks[%d]", i, b.Key, j)}
		}
		seen[b.Key] = i
	}
	res, failed, err := s.put(blocks, deadline, blockstream.ParamsFlag, []byte(params))
	if err != nil {
		return nil, nil, err
	}
	if failed != nil {
		return nil, nil, &answerError{failed}
	}
	stored = make([]bool, len(res))
	for i, r := range res {
		// Sizes were checked and no room is a refusal: a rejected block
		// was damaged on the way.
		if r == PutRejected {
			damaged = append(damaged, i)
		}
		stored[i] = r == PutStored
	}
	return stored, damaged, nil
}

// GetOptions tune GetBlocks.
type GetOptions struct {
	CallOptions
	// Wait lets the daemon drive steps until promotions from secondary
	// tiers land (0: one lookup pass).
	Wait time.Duration
	// PrefixOnly returns data only for the leading hits.
	PrefixOnly bool
	// Checksums asks for the XXH3-64 of every returned block
	// (Blocks.Checksums), to verify what arrived. Such a call uses the
	// API; the block stream verifies every block it carries anyway.
	Checksums bool
	// Buffers, when set (one per key, each at least the slot size),
	// receive the blocks: Data[i] is Buffers[i][:slot size] for every
	// returned block, so a caller can reuse its memory from call to call.
	// Nil allocates, and so does a buffer shorter than the slot.
	Buffers [][]byte
}

// Blocks is the answer of GetBlocks: Data[i] is set when Results[i] is
// HIT; Hits counts the leading hits.
type Blocks struct {
	Results []kvtierv1.LookupResult
	Data    [][]byte
	Hits    int
	// Checksums[i] is the XXH3-64 of Data[i] as the daemon read it (with
	// GetOptions.Checksums; nil otherwise).
	Checksums []uint64
}

// GetBlocks loads blocks by value.
func (c *Client) GetBlocks(ctx context.Context, keys []offload.Key, o GetOptions) (Blocks, error) {
	if o.Buffers != nil && len(o.Buffers) != len(keys) {
		return Blocks{}, fmt.Errorf("kvtier client: GetBlocks: %d buffers for %d keys", len(o.Buffers), len(keys))
	}
	if o.RequestID == "" && !o.Checksums && len(keys) > 0 && len(o.Params) < 1<<16 {
		var out Blocks
		used, err := c.onStream(ctx, func(s *Stream, slotSize int, deadline time.Time) error {
			var serr error
			out, serr = getOnStream(s, slotSize, keys, o, deadline)
			return serr
		})
		if used {
			return out, err
		}
	}
	resp, err := c.api.GetBlocks(ctx, &kvtierv1.GetBlocksRequest{
		Namespace: c.ns, RequestId: o.RequestID, KvTransferParams: o.Params, Keys: keyBytes(keys),
		WaitMs: uint32(o.Wait / time.Millisecond), PrefixOnly: o.PrefixOnly, WantChecksums: o.Checksums,
	})
	if err != nil {
		return Blocks{}, err
	}
	out := Blocks{Results: resp.GetResults(), Hits: int(resp.GetHits()), Data: make([][]byte, len(resp.GetBlocks())), Checksums: resp.GetChecksums()}
	for i, b := range resp.GetBlocks() {
		out.Data[i] = b.GetData()
		if d := out.Data[i]; o.Buffers != nil && d != nil && len(o.Buffers[i]) >= len(d) {
			out.Data[i] = o.Buffers[i][:copy(o.Buffers[i], d)]
		}
	}
	return out, nil
}

// getOnStream is GetBlocks on the stream.
func getOnStream(s *Stream, slotSize int, keys []offload.Key, o GetOptions, deadline time.Time) (Blocks, error) {
	data := make([][]byte, len(keys))
	dst := func(i int, n int64) []byte {
		if n != int64(slotSize) {
			return nil
		}
		if o.Buffers != nil && len(o.Buffers[i]) >= slotSize {
			data[i] = o.Buffers[i][:slotSize]
		} else {
			data[i] = make([]byte, slotSize)
		}
		return data[i]
	}
	results, hits, res, failed, err := s.getOpts(keys, []byte(o.Params), o.Wait, o.PrefixOnly, deadline, dst)
	if err != nil {
		return Blocks{}, err
	}
	if failed != nil {
		return Blocks{}, &answerError{failed}
	}
	for i, r := range res {
		switch r {
		case StreamWrongSize, StreamCorrupt:
			// Damaged on the way (or the slot size changed): the stream is
			// in step, but the call is made again through the API.
			return Blocks{}, fmt.Errorf("block stream: block %d (%s) damaged on the way", i, keys[i])
		case StreamGone:
			data[i] = nil
		}
	}
	return Blocks{Results: results, Data: data, Hits: hits}, nil
}
