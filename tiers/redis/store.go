package redis

import (
	"context"
	"fmt"
	"sync"

	goredis "github.com/redis/go-redis/v9"

	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/tiers/remote"
)

// store writes the job's blocks with SET, node by node (concurrently in
// a cluster; the blocks of a node marked down are refused at once): first
// straight from the slots (package slotpipe: one vectored write per block
// on the tier's own connection to the node, the slot read and claimed at
// memory speed: what the socket does not take at once is copied), then
// through go-redis whatever that did not store — a redirection, a server
// error, a connection that failed — from sealed copies, with the node's
// retries. SET is idempotent, so a block whose first write's fate is
// unknown is simply written again.
func (t *Tier) store(ctx context.Context, job *offload.Job) ([]remote.Fate, error) {
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
	idx := make([]int, len(job.Keys))
	for i := range idx {
		idx[i] = i
	}
	var mu sync.Mutex
	var first error
	down := t.eachNode(ctx, job.Keys, idx, func(ctx context.Context, n *node, idx []int) {
		if err := t.storeTo(ctx, n, job, idx, slots, state); err != nil {
			mu.Lock()
			first = cmp(first, err)
			mu.Unlock()
		}
	})
	if first != nil {
		return nil, fmt.Errorf("%s: store job %d: %w", t.label(), job.ID, first)
	}
	var fates []remote.Fate
	for _, i := range down {
		state[i] = blockRefused
	}
	n := int64(0)
	for i, s := range state {
		f := remote.Written
		switch s {
		case blockStored:
			n++
			continue
		case blockTakenBack:
			f = remote.TakenBack
		case blockRefused:
			f = remote.NodeDown
		}
		if fates == nil {
			fates = make([]remote.Fate, len(job.Keys))
		}
		fates[i] = f
	}
	t.c.BlocksStored.Add(n)
	t.c.BytesWritten.Add(n * int64(job.Arena.SlotSize()))
	return fates, nil
}

// storeTo writes the blocks idx of job to node n.
func (t *Tier) storeTo(ctx context.Context, n *node, job *offload.Job, idx []int, slots [][]byte, state []blockState) error {
	retries := t.cfg.Retries
	if t.pipes != nil {
		err := t.direct(ctx, func(ctx context.Context) error {
			return t.storeOnNode(ctx, n.addr, job, idx, slots, state)
		})
		var fail error
		if retries, fail = t.afterDirect(ctx, n, err, "store", job.ID); fail != nil {
			return fail
		}
	}
	return t.storeSealed(ctx, n, job, idx, slots, state, retries)
}

type blockState uint8

const (
	blockPending   blockState = iota
	blockStored               // the server answered OK
	blockTakenBack            // the manager took the block back before it was read
	blockRefused              // its node is down: not sent
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

// storeSealed writes the blocks of idx still pending in one go-redis
// pipeline of SET, with node n's retries, each block copied behind its
// header (sealed) first; a block's claim covers only its sealing.
func (t *Tier) storeSealed(ctx context.Context, n *node, job *offload.Job, idx []int, slots [][]byte, state []blockState, retries int) error {
	var todo []int
	for _, i := range idx {
		if state[i] == blockPending {
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
	return n.retry.Do(ctx, retries, func(ctx context.Context) error {
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
