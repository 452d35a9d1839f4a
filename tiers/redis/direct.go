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

// direct runs the first attempt of a transfer on the tier's own
// connections (package slotpipe): it groups the blocks idx by the server
// that holds their keys and runs perNode for each group concurrently,
// within the tier's timeout. It returns the first failure, if any: of
// routing, of a connection (see isTransport) or a server's error reply.
// The blocks a failure left unfinished go to the go-redis client next.
func (t *Tier) direct(ctx context.Context, keys []offload.Key, idx []int, perNode func(ctx context.Context, addr string, idx []int) error) error {
	if len(idx) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, t.cfg.Timeout)
	defer cancel()
	byNode := map[string][]int{}
	var first error
	for _, i := range idx {
		addr, err := t.nodeOf(ctx, t.redisKey(keys[i]))
		if err != nil {
			first = cmp(first, fmt.Errorf("route %s: %w", keys[i], err))
			continue
		}
		byNode[addr] = append(byNode[addr], i)
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for addr, idx := range byNode {
		wg.Go(func() {
			if err := perNode(ctx, addr, idx); err != nil {
				mu.Lock()
				first = cmp(first, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if first != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.c.Timeouts.Add(1)
	}
	return first
}

// afterDirect accounts for the outcome err of a direct attempt of job id
// and returns the retries left for the client's attempt, or the error
// that ends the job now (its context ended, or the wire failed and no
// retry is left). A failure on the wire counts toward health and as one
// of the job's attempts; a server's answer (a redirection, an error
// reply) proves the server up and leaves every retry to the client,
// which follows redirections and judges the error itself.
func (t *Tier) afterDirect(ctx context.Context, err error, op string, id uint64) (retries int, fail error) {
	retries = t.cfg.Retries
	switch {
	case err == nil:
		t.health.Success()
	case ctx.Err() != nil:
		return 0, err
	case isTransport(err):
		t.health.Failure(err)
		if retries == 0 || !t.health.Healthy() {
			return 0, err
		}
		retries--
		t.c.Retries.Add(1)
		t.log.Debug("direct "+op+" failed; again through the client", "job", id, "err", err)
	default:
		t.health.Success()
		t.log.Debug("direct "+op+" answered with an error; again through the client", "job", id, "err", err)
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

// nodeOf returns the address of the server that holds key: the master of
// its slot in a cluster (from the client's slot map), else the server.
func (t *Tier) nodeOf(ctx context.Context, key string) (string, error) {
	cc, ok := t.client.(*goredis.ClusterClient)
	if !ok {
		return t.cfg.Addr, nil
	}
	c, err := cc.MasterForKey(ctx, key)
	if err != nil {
		return "", err
	}
	return c.Options().Addr, nil
}

// isTransport reports a failure that is the connection's, not an answer
// of the server: then the server may be down, and the failure counts
// toward health.
func isTransport(err error) bool {
	var re goredis.Error
	return !errors.As(err, &re) || classify(err) == remote.Transient
}
