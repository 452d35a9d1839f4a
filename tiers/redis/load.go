package redis

import (
	"context"
	"errors"
	"fmt"

	goredis "github.com/redis/go-redis/v9"

	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/tiers/remote"
)

// deleteIfUnchanged deletes KEYS[1] only if it still holds ARGV[1]: a
// corrupt value is removed, but a good value written since the read is
// not.
var deleteIfUnchanged = goredis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
	return redis.call('DEL', KEYS[1])
end
return 0`)

// load GETs every key with a slot, node by node (concurrently in a
// cluster; the keys of a node marked down fail at once): first on the
// tier's own connections, one pipeline per node, each value read by the
// kernel into a header buffer and the slot itself and verified there
// (package slotpipe); then through go-redis the keys that path left
// without an answer — a redirection, an error reply, a connection that
// failed. GET returns one consistent value; a value that vanished reads as
// missing and one that changed underneath fails the checksum, so no bad
// bytes are served. A slot whose value fails verification holds them, but
// the primary never exposes the slot of a failed promotion.
func (t *Tier) load(ctx context.Context, job *offload.Job, slots [][]byte, errs []error) {
	select {
	case t.ioSem <- struct{}{}:
	case <-ctx.Done():
		for i := range errs {
			if errs[i] == nil {
				errs[i] = ctx.Err()
			}
		}
		return
	}
	defer func() { <-t.ioSem }()

	idx := make([]int, 0, len(job.Keys))
	for i := range job.Keys {
		if slots[i] != nil {
			idx = append(idx, i)
		}
	}
	// answered[i]: block i's outcome is final (loaded, or errs[i] set).
	answered := make([]bool, len(job.Keys))
	down := t.eachNode(ctx, job.Keys, idx, func(ctx context.Context, n *node, idx []int) {
		t.loadFrom(ctx, n, job, idx, slots, errs, answered)
	})
	for _, i := range down {
		errs[i] = fmt.Errorf("%s: load %s: %w", t.label(), job.Keys[i], ErrNodeDown)
	}
}

// loadFrom loads the blocks idx of job from node n.
func (t *Tier) loadFrom(ctx context.Context, n *node, job *offload.Job, idx []int, slots [][]byte, errs []error, answered []bool) {
	retries := t.cfg.Retries
	if t.pipes != nil {
		err := t.direct(ctx, func(ctx context.Context) error {
			return t.loadOnNode(ctx, n.addr, job.Keys, idx, slots, errs, answered)
		})
		var fail error
		if retries, fail = t.afterDirect(ctx, n, err, "load", job.ID); fail != nil {
			for _, i := range idx {
				if !answered[i] {
					errs[i] = fmt.Errorf("%s: load %s: %w", t.label(), job.Keys[i], fail)
				}
			}
			return
		}
	}
	left := idx[:0:0]
	for _, i := range idx {
		if !answered[i] {
			left = append(left, i)
		}
	}
	t.loadClient(ctx, n, job.Keys, left, slots, errs, retries)
}

// loadOnNode reads the values of keys idx from the master at addr on one
// connection: every GET is sent at once, then each value is read into
// its slot and verified before the next is read.
func (t *Tier) loadOnNode(ctx context.Context, addr string, keys []offload.Key, idx []int, slots [][]byte, errs []error, answered []bool) error {
	c, err := t.pipes.Get(ctx, addr)
	if err != nil {
		return err
	}
	for _, i := range idx {
		c.Get(t.redisKey(keys[i]))
	}
	var hdr [remote.HeaderSize]byte
	var first error
	for _, i := range idx {
		k := keys[i]
		v, err := c.ReadValue(ctx, int(t.cfg.MaxValueBytes), hdr[:], slots[i])
		if err != nil {
			c.Close()
			return err
		}
		switch {
		case v.Err != nil:
			first = cmp(first, fmt.Errorf("get %s on %s: %w", k, addr, v.Err))
			continue // left to the client
		case !v.Found:
			errs[i] = fmt.Errorf("%s: load %s: %w", t.label(), k, ErrNotFound)
		case v.Into:
			errs[i] = t.verified(ctx, k, len(slots[i]), verifyInto(k, hdr[:], slots[i]), func() string { return string(hdr[:]) + string(slots[i]) })
		case v.Other != nil:
			errs[i] = t.verified(ctx, k, len(slots[i]), remote.OpenString(k, string(v.Other), slots[i]), func() string { return string(v.Other) })
		default:
			t.c.SizeMismatch.Add(1)
			errs[i] = fmt.Errorf("%s: load %s: %w: %d-byte value, over max_value_bytes", t.label(), k, remote.ErrSizeMismatch, v.N)
		}
		answered[i] = true
	}
	c.Put()
	return first
}

// verifyInto checks an envelope read as hdr and payload (its slot).
func verifyInto(k offload.Key, hdr, payload []byte) error {
	h, err := remote.ParseHeader(hdr, k)
	if err != nil {
		return err
	}
	return h.Verify(payload)
}

// verified finishes the load of k (n bytes) whose verification returned
// verr: it counts a good block, or counts and reports a bad one, deleting
// a corrupt value (value returns it as read) unless it changed since.
func (t *Tier) verified(ctx context.Context, k offload.Key, n int, verr error, value func() string) error {
	if verr == nil {
		t.c.BlocksLoaded.Add(1)
		t.c.BytesRead.Add(int64(n))
		return nil
	}
	switch {
	case errors.Is(verr, remote.ErrCorrupt):
		t.c.Corrupted.Add(1)
		t.log.Warn("corrupt block deleted", "key", k.String(), "err", verr)
		t.deleteCorrupt(ctx, k, value())
	case errors.Is(verr, remote.ErrSizeMismatch):
		t.c.SizeMismatch.Add(1)
	}
	return fmt.Errorf("%s: load %s: %w", t.label(), k, verr)
}

// loadClient GETs the keys idx in one go-redis pipeline, with node n's
// retries, and verifies each value before it copies it into its slot.
func (t *Tier) loadClient(ctx context.Context, n *node, keys []offload.Key, idx []int, slots [][]byte, errs []error, retries int) {
	if len(idx) == 0 {
		return
	}
	var cmds []*goredis.StringCmd
	err := n.retry.Do(ctx, retries, func(ctx context.Context) error {
		pipe := t.client.Pipeline()
		cmds = make([]*goredis.StringCmd, len(idx))
		for j, i := range idx {
			cmds[j] = pipe.Get(ctx, t.redisKey(keys[i]))
		}
		_, err := pipe.Exec(ctx)
		if err != nil && !errors.Is(err, goredis.Nil) {
			for _, c := range cmds {
				if c.Err() != nil && !errors.Is(c.Err(), goredis.Nil) {
					return c.Err()
				}
			}
			return err
		}
		return nil
	})
	for j, i := range idx {
		k := keys[i]
		if err != nil {
			errs[i] = fmt.Errorf("%s: load %s: %w", t.label(), k, err)
			continue
		}
		val, gerr := cmds[j].Result()
		switch {
		case errors.Is(gerr, goredis.Nil):
			errs[i] = fmt.Errorf("%s: load %s: %w", t.label(), k, ErrNotFound)
		case gerr != nil:
			errs[i] = fmt.Errorf("%s: load %s: %w", t.label(), k, gerr)
		default:
			errs[i] = t.verified(ctx, k, len(slots[i]), remote.OpenString(k, val, slots[i]), func() string { return val })
		}
	}
}

// deleteCorrupt removes k if it still holds the corrupt value val, and
// reports the removal unless keyspace events will.
func (t *Tier) deleteCorrupt(ctx context.Context, k offload.Key, val string) {
	nd := t.route(t.redisKey(k))
	if nd == nil {
		return // its slot has no master now; the next load finds it again
	}
	var n int64
	err := nd.retry.Do(ctx, 0, func(ctx context.Context) error {
		var err error
		n, err = deleteIfUnchanged.Run(ctx, t.client, []string{t.redisKey(k)}, val).Int64()
		return err
	})
	if err != nil {
		t.log.Warn("deleting corrupt block failed", "key", k.String(), "err", err)
		return
	}
	if n == 0 {
		return // replaced or gone since the read: nothing of ours to remove
	}
	t.c.Deleted.Add(1)
	if !t.notify.Load() {
		t.events.Removed([]offload.Key{k})
	}
}
