package redis

import (
	"context"
	"fmt"
	"strings"

	goredis "github.com/redis/go-redis/v9"

	"github.com/kvtier/kvtier/offload"
)

// neededNotifyFlags are the notify-keyspace-events flags the tier needs:
// E (key-event channels), g (generic: DEL), x (expired), e (evicted).
const neededNotifyFlags = "Egxe"

// enableNotifications makes sure the server publishes the key events the
// tier subscribes to, adding the missing flags with CONFIG SET. Managed
// services often forbid CONFIG; the tier then logs that removals from the
// server go unreported (unless the operator configured the flags).
func (t *Tier) enableNotifications(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, t.cfg.Timeout)
	defer cancel()
	cur, err := t.client.ConfigGet(ctx, "notify-keyspace-events").Result()
	if err != nil {
		t.notify.Store(false)
		t.log.Warn("keyspace events are off: cannot read notify-keyspace-events; blocks the server evicts or expires will not be reported as removed unless it is configured with notify-keyspace-events "+neededNotifyFlags, "err", err)
		return
	}
	flags := cur["notify-keyspace-events"]
	missing := missingFlags(flags)
	if missing == "" {
		t.notify.Store(true)
		return
	}
	if err := t.client.ConfigSet(ctx, "notify-keyspace-events", flags+missing).Err(); err != nil {
		t.notify.Store(false)
		t.log.Warn("keyspace events are off: CONFIG SET notify-keyspace-events not allowed; blocks the server evicts or expires will not be reported as removed", "current", flags, "err", err)
		return
	}
	t.notify.Store(true)
	t.log.Info("enabled keyspace events", "notify-keyspace-events", flags+missing)
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

// startSubscriber follows the key-event channels. The client reconnects
// and resubscribes by itself after a server restart; removals published
// while it was away are lost (pub/sub keeps nothing), so every
// (re)subscription triggers a reconciliation pass.
func (t *Tier) startSubscriber() {
	ps := t.client.Subscribe(t.ctx, keyEventChannels(t.cfg.DB)...)
	// Wait for the server's confirmation so that removals right after New
	// are not missed; on failure the channel below keeps reconnecting.
	ctx, cancel := context.WithTimeout(t.ctx, t.cfg.Timeout)
	if _, err := ps.Receive(ctx); err != nil {
		t.log.Warn("keyspace event subscription not confirmed yet", "err", err)
	}
	cancel()
	ch := ps.ChannelWithSubscriptions(goredis.WithChannelSize(4096))
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		defer ps.Close()
		for {
			select {
			case <-t.ctx.Done():
				return
			case msg, ok := <-ch:
				if !ok {
					return
				}
				t.removed(t.drainBatch(msg, ch))
			}
		}
	}()
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
