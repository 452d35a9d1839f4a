package redis

import (
	"context"
	"fmt"
	"strings"
	"sync"

	goredis "github.com/redis/go-redis/v9"

	"github.com/kvtier/kvtier/offload"
)

// neededNotifyFlags are the notify-keyspace-events flags the tier needs:
// E (key-event channels), g (generic: DEL), x (expired), e (evicted).
const neededNotifyFlags = "Egxe"

// enableNotifications makes sure the server (every node of a cluster)
// publishes the key events the tier subscribes to, adding the missing
// flags with CONFIG SET. Managed services often forbid CONFIG; the tier
// then logs that removals from the server go unreported (unless the
// operator configured the flags).
func (t *Tier) enableNotifications(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, t.cfg.Timeout)
	defer cancel()
	var err error
	if cc, ok := t.client.(*goredis.ClusterClient); ok {
		// Replicas too: a promoted replica must already publish them.
		var mu sync.Mutex
		err = cc.ForEachShard(ctx, func(ctx context.Context, c *goredis.Client) error {
			e := t.enableOn(ctx, c)
			mu.Lock()
			defer mu.Unlock()
			if e != nil {
				return fmt.Errorf("%s: %w", c.Options().Addr, e)
			}
			return nil
		})
	} else {
		err = t.enableOn(ctx, t.client)
	}
	if err != nil {
		t.notify.Store(false)
		t.log.Warn("keyspace events are off: cannot read or set notify-keyspace-events (CONFIG not allowed?); blocks the server evicts or expires will not be reported as removed unless it is configured with notify-keyspace-events "+neededNotifyFlags, "err", err)
		return
	}
	t.notify.Store(true)
}

// enableOn adds the missing notification flags on one server.
func (t *Tier) enableOn(ctx context.Context, c goredis.Cmdable) error {
	cur, err := c.ConfigGet(ctx, "notify-keyspace-events").Result()
	if err != nil {
		return err
	}
	flags := cur["notify-keyspace-events"]
	missing := missingFlags(flags)
	if missing == "" {
		return nil
	}
	if err := c.ConfigSet(ctx, "notify-keyspace-events", flags+missing).Err(); err != nil {
		return err
	}
	t.log.Info("enabled keyspace events", "notify-keyspace-events", flags+missing)
	return nil
}

// missingFlags returns the needed flags that flags lacks. 'A' stands for
// every event class, including g, x and e.
func missingFlags(flags string) string {
	var out []byte
	for _, f := range []byte(neededNotifyFlags) {
		if strings.IndexByte(flags, f) >= 0 || (f != 'E' && strings.IndexByte(flags, 'A') >= 0) {
			continue
		}
		out = append(out, f)
	}
	return string(out)
}

// keyEventChannels are the channels of the events that remove a key.
func keyEventChannels(db int) []string {
	return []string{
		fmt.Sprintf("__keyevent@%d__:evicted", db),
		fmt.Sprintf("__keyevent@%d__:expired", db),
		fmt.Sprintf("__keyevent@%d__:del", db),
	}
}

// keyEventSub follows the key-event channels of one server.
type keyEventSub struct {
	ps     *goredis.PubSub
	cancel context.CancelFunc
	done   chan struct{}
}

// stop ends the subscription and waits for its goroutine.
func (s *keyEventSub) stop() {
	s.cancel()
	_ = s.ps.Close()
	<-s.done
}

// subscribe follows the key-event channels on c (a single server or one
// cluster master; node names it in logs). The client reconnects and
// resubscribes by itself after a server restart; removals published
// while it was away are lost (pub/sub keeps nothing), so every
// (re)subscription triggers a reconciliation pass.
func (t *Tier) subscribe(c goredis.UniversalClient, node string) *keyEventSub {
	ctx, cancel := context.WithCancel(t.ctx)
	s := &keyEventSub{ps: c.Subscribe(ctx, keyEventChannels(t.cfg.DB)...), cancel: cancel, done: make(chan struct{})}
	// Wait for the server's confirmation so that removals right after New
	// are not missed; on failure the channel below keeps reconnecting.
	rctx, rcancel := context.WithTimeout(ctx, t.cfg.Timeout)
	if _, err := s.ps.Receive(rctx); err != nil {
		t.log.Warn("keyspace event subscription not confirmed yet", "node", node, "err", err)
	}
	rcancel()
	ch := s.ps.ChannelWithSubscriptions(goredis.WithChannelSize(4096))
	go func() {
		defer close(s.done)
		for {
			select {
			case <-ctx.Done():
				return
			case msg, ok := <-ch:
				if !ok {
					return
				}
				t.removed(t.drainBatch(msg, ch))
			}
		}
	}()
	return s
}

// drainBatch collects the keys of first and of whatever else is already
// queued (up to a bound), so that a burst of evictions becomes one event.
// A subscription confirmation (a reconnection) triggers reconciliation.
func (t *Tier) drainBatch(first any, ch <-chan any) []offload.Key {
	const maxBatch = 512
	keys := make([]offload.Key, 0, 8)
	add := func(m any) {
		switch m := m.(type) {
		case *goredis.Message:
			if k, ok := t.parseKey(m.Payload); ok {
				keys = append(keys, k)
			}
		case *goredis.Subscription:
			if m.Kind == "subscribe" {
				t.recon.Trigger()
			}
		}
	}
	add(first)
	for len(keys) < maxBatch {
		select {
		case m, ok := <-ch:
			if !ok {
				return keys
			}
			add(m)
		default:
			return keys
		}
	}
	return keys
}

// removed records keys the server dropped: their cached lookup verdicts
// go, and a removed event reports them.
func (t *Tier) removed(keys []offload.Key) {
	if len(keys) == 0 {
		return
	}
	t.serverRemoved.Add(int64(len(keys)))
	t.Invalidate(keys...)
	t.events.Removed(keys)
}
