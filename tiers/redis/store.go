package redis

import (
	"context"
	"fmt"
	"sync"

	goredis "github.com/redis/go-redis/v9"

	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/tiers/remote"
)

// store writes the job's blocks with SET: first straight from the slots
// (package slotpipe: one vectored write per block on the tier's own
// connection to the block's master, the slot read and claimed at memory
// speed: what the socket does not take at once is copied), then through
// go-redis whatever that did not store — a redirection, a server error,
// a connection that failed — from sealed copies, with the tier's retries.
// SET is idempotent, so a block whose first write's fate is unknown is
// simply written again.
func (t *Tier) store(ctx context.Context, job *offload.Job) ([]bool, error) {
	if len(job.Slots) < len(job.Keys) {
		return nil, fmt.Errorf("%s: store job %d: %d slots for %d keys", t.label(), job.ID, len(job.Slots), len(job.Keys))
	}
	if need := int64(remote.HeaderSize + job.Arena.SlotSize()); need > int64(t.cfg.MaxValueBytes) {
		return nil, fmt.Errorf("%s: store job %d: %w: %d-byte value, max_value_bytes %d", t.label(), job.ID, ErrValueTooLarge, need, t.cfg.MaxValueBytes)
	}
	slots := make([][]byte, len(job.Keys))
	for i, k := range job.Keys {
		if !k.Valid() {
			return nil, fmt.Errorf("%s: store: %w", t.label(), offload.ErrInvalidKey)
		}
		slot, err := job.Arena.Slot(job.Slots[i])
		if err != nil {
			return nil, fmt.Errorf("%s: store %s: %w", t.label(), k, err)
		}
		slots[i] = slot
	}
	select {
	case t.ioSem <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("%s: store job %d: %w", t.label(), job.ID, ctx.Err())
	}
	defer func() { <-t.ioSem }()

	// state[i]: what became of block i so far.
	state := make([]blockState, len(job.Keys))
	retries := t.cfg.Retries
	if t.pipes != nil {
		idx := make([]int, len(job.Keys))
		for i := range idx {
			idx[i] = i
		}
		err := t.direct(ctx, job.Keys, idx, func(ctx context.Context, addr string, idx []int) error {
			return t.storeOnNode(ctx, addr, job, idx, slots, state)
		})
		var fail error
		if retries, fail = t.afterDirect(ctx, err, "store", job.ID); fail != nil {
			return nil, fmt.Errorf("%s: store job %d: %w", t.label(), job.ID, fail)
		}
	}
	if err := t.storeSealed(ctx, job, slots, state, retries); err != nil {
		return nil, fmt.Errorf("%s: store job %d: %w", t.label(), job.ID, err)
	}
	var skipped []bool
	n := int64(0)
	for i, s := range state {
		switch s {
		case blockStored:
			n++
		case blockTakenBack:
			if skipped == nil {
				skipped = make([]bool, len(job.Keys))
			}
			skipped[i] = true
		}
	}
	t.c.BlocksStored.Add(n)
	t.c.BytesWritten.Add(n * int64(job.Arena.SlotSize()))
	return skipped, nil
}

type blockState uint8

const (
	blockPending   blockState = iota
	blockStored               // the server answered OK
	blockTakenBack            // the manager took the block back before it was read
)

// storeOnNode writes the blocks idx of job to the master at addr on one
// connection: every SET first, then the replies. A block is claimed only
// while Set reads its slot, which ends at memory speed however slow the
// server (what the socket does not take at once is copied and sent in
// the background); the connection is ready before the claim, so no claim
// waits on the previous block's write. Each goroutine touches only its
// own indices of state.
func (t *Tier) storeOnNode(ctx context.Context, addr string, job *offload.Job, idx []int, slots [][]byte, state []blockState) error {
	c, err := t.pipes.Get(ctx, addr)
	if err != nil {
		return err
	}
	sent := make([]int, 0, len(idx))
	var hdr [remote.HeaderSize]byte
	for _, i := range idx {
		if err := c.Ready(ctx); err != nil {
			c.Close()
			return err
		}
		if !job.Claim(i) {
			state[i] = blockTakenBack
			continue
		}
		remote.PutHeader(hdr[:], job.Keys[i], slots[i])
		err := c.Set(ctx, t.redisKey(job.Keys[i]), t.cfg.TTL, hdr[:], slots[i])
		job.Release(i)
		if err != nil {
			c.Close()
			return err
		}
		sent = append(sent, i)
	}
	if len(sent) == 0 {
		c.Put()
		return nil
	}
	verdicts, err := c.Replies(ctx)
	c.Put()
	var first error
	for j, v := range verdicts {
		if v == nil {
			state[sent[j]] = blockStored
		} else if first == nil {
			first = fmt.Errorf("set %s on %s: %w", job.Keys[sent[j]], addr, v)
		}
	}
	if err != nil {
		return err // the transport failure outranks an answered error
	}
	return first
}

var sealPool = sync.Pool{New: func() any { return new([]byte) }}

// storeSealed writes the blocks still pending in one go-redis pipeline
// of SET, each block copied behind its header (sealed) first; a block's
// claim covers only its sealing.
func (t *Tier) storeSealed(ctx context.Context, job *offload.Job, slots [][]byte, state []blockState, retries int) error {
	var todo []int
	for i, s := range state {
		if s == blockPending {
			todo = append(todo, i)
		}
	}
	if len(todo) == 0 {
		return nil
	}
	bufs := make([]*[]byte, len(todo))
	for j := range bufs {
		bufs[j] = sealPool.Get().(*[]byte)
	}
	defer func() {
		for _, b := range bufs {
			sealPool.Put(b)
		}
	}()
	// Sealing (checksum and copy) is the tier's own cost per byte: spread
	// a job's blocks over the cores.
	remote.Parallel(len(todo), func(j int) {
		i := todo[j]
		if !job.Claim(i) {
			state[i] = blockTakenBack
			return
		}
		*bufs[j] = remote.Seal(*bufs[j], job.Keys[i], slots[i])
		job.Release(i)
	})
	return t.retry.Do(ctx, retries, func(ctx context.Context) error {
		pipe := t.client.Pipeline()
		cmds := make([]*goredis.StatusCmd, len(todo))
		n := 0
		for j, i := range todo {
			if state[i] == blockPending {
				cmds[j] = pipe.Set(ctx, t.redisKey(job.Keys[i]), *bufs[j], t.cfg.TTL)
				n++
			}
		}
		if n == 0 {
			return nil
		}
		_, err := pipe.Exec(ctx)
		for j, c := range cmds {
			if c == nil {
				continue
			}
			if c.Err() == nil {
				state[todo[j]] = blockStored
			} else if err != nil {
				err = fmt.Errorf("set %s: %w", job.Keys[todo[j]], c.Err())
			}
		}
		return err
	})
}
