package redis

import (
	"context"
	"errors"
	"fmt"
	"sync"

	goredis "github.com/redis/go-redis/v9"

	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/tiers/remote"
)

// ErrNodeDown reports a block whose cluster node (the master of its slot)
// is marked down, or whose slot has no master: it is neither read nor
// written until the node recovers or the slot map moves the slot.
var ErrNodeDown = fmt.Errorf("cluster node down: %w", remote.ErrUnavailable)

// eachNode runs fn once per node that holds blocks idx of keys, with that
// node's blocks, concurrently, and returns the blocks whose node is down
// (in a cluster; nothing is spent on them). fn touches only its own
// indices of any slice it shares.
func (t *Tier) eachNode(ctx context.Context, keys []offload.Key, idx []int, fn func(ctx context.Context, n *node, idx []int)) (down []int) {
	if len(idx) == 0 {
		return nil
	}
	if t.cl == nil {
		fn(ctx, t.single, idx)
		return nil
	}
	type group struct {
		n   *node
		idx []int
	}
	var groups []group
	t.cl.mu.RLock()
	for _, i := range idx {
		n := t.cl.masters[t.cl.slots.Master(t.redisKey(keys[i]))]
		if n == nil || !n.health.Healthy() {
			down = append(down, i)
			continue
		}
		j := 0
		for j < len(groups) && groups[j].n != n {
			j++
		}
		if j == len(groups) {
			groups = append(groups, group{n: n})
		}
		groups[j].idx = append(groups[j].idx, i)
	}
	t.cl.mu.RUnlock()
	if len(down) > 0 {
		t.c.BlocksNodeDown.Add(int64(len(down)))
	}
	if len(groups) == 1 {
		fn(ctx, groups[0].n, groups[0].idx)
		return down
	}
	var wg sync.WaitGroup
	for _, g := range groups {
		wg.Go(func() { fn(ctx, g.n, g.idx) })
	}
	wg.Wait()
	return down
}

// direct runs attempt, the first attempt of a transfer on the tier's own
// connections (package slotpipe) to node n, within the tier's timeout.
func (t *Tier) direct(ctx context.Context, attempt func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, t.cfg.Timeout)
	defer cancel()
	err := attempt(ctx)
	if err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.c.Timeouts.Add(1)
	}
	return err
}

// afterDirect accounts for the outcome err of a direct attempt on node n
// for job id and returns the retries left for the client's attempt, or
// the error that ends the node's part of the job now (its context ended,
// or the wire failed and no retry is left). A failure on the wire counts
// toward the node's health, as one of the job's attempts, and asks for a
// new slot map (the node may have died in a failover); a server's answer
// (a redirection, an error reply) proves the node up and leaves every
// retry to the client, which follows redirections and judges the error
// itself — a redirection also asks for a new slot map.
func (t *Tier) afterDirect(ctx context.Context, n *node, err error, op string, id uint64) (retries int, fail error) {
	retries = t.cfg.Retries
	switch {
	case err == nil:
		n.health.Success()
	case ctx.Err() != nil:
		return 0, err
	case isTransport(err):
		n.health.Failure(err)
		t.reloadSoon()
		if retries == 0 || !n.health.Healthy() {
			return 0, err
		}
		retries--
		t.c.Retries.Add(1)
		t.log.Debug("direct "+op+" failed; again through the client", "job", id, "node", n.addr, "err", err)
	default:
		n.health.Success()
		if isRedirect(err) {
			t.reloadSoon()
		}
		t.log.Debug("direct "+op+" answered with an error; again through the client", "job", id, "node", n.addr, "err", err)
	}
	return retries, nil
}

// cmp keeps the first error.
func cmp(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

// isTransport reports a failure that is the connection's, not an answer
// of the server: then the server may be down, and the failure counts
// toward health.
func isTransport(err error) bool {
	var re goredis.Error
	return !errors.As(err, &re) || classify(err) == remote.Transient
}

// isRedirect reports a MOVED or ASK reply: the slot map changed.
func isRedirect(err error) bool {
	return goredis.HasErrorPrefix(err, "MOVED") || goredis.HasErrorPrefix(err, "ASK")
}
