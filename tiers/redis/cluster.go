package redis

import (
	"context"
	"crypto/tls"
	"slices"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// newClient returns the client of cfg: a single-server client, or a
// cluster client over the seed nodes. Either way the tier retries itself
// (MaxRetries -1), so that it stops as soon as the server is marked down;
// a cluster client still follows MOVED/ASK redirections and reloads the
// slot map after a failover.
func newClient(cfg Config, tc *tls.Config) goredis.UniversalClient {
	if cfg.Cluster {
		return goredis.NewClusterClient(&goredis.ClusterOptions{
			Addrs:                 cfg.seeds(),
			Username:              cfg.Username,
			Password:              cfg.Password,
			TLSConfig:             tc,
			PoolSize:              cfg.PoolSize,
			DialTimeout:           cfg.DialTimeout,
			DialerRetries:         1,
			ReadTimeout:           cfg.Timeout,
			WriteTimeout:          cfg.Timeout,
			PoolTimeout:           cfg.Timeout,
			ContextTimeoutEnabled: true,
			MaxRetries:            -1,
			MaxRedirects:          8,
			DisableIdentity:       true,
		})
	}
	return goredis.NewClient(nodeOptions(cfg, cfg.Addr, tc))
}

// nodeOptions are the options of a client of one server (over TLS with
// tc).
func nodeOptions(cfg Config, addr string, tc *tls.Config) *goredis.Options {
	return &goredis.Options{
		Addr:                     addr,
		Username:                 cfg.Username,
		Password:                 cfg.Password,
		TLSConfig:                tc,
		DB:                       cfg.DB,
		PoolSize:                 cfg.PoolSize,
		DialTimeout:              cfg.DialTimeout,
		DialerRetries:            1,
		ReadTimeout:              cfg.Timeout,
		WriteTimeout:             cfg.Timeout,
		PoolTimeout:              cfg.Timeout,
		ContextTimeoutEnabled:    true,
		MaxRetries:               -1,
		DisableIdentity:          true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	}
}

// clusterNodes is what the tier tracks of a cluster's masters. Keyspace
// notifications are local to the node where a key lives, so the tier
// subscribes on every master, and follows failovers: a replica promoted
// to master gets a subscription (and a reconciliation pass covers what
// happened before it), a node that is no longer a master loses it.
type clusterNodes struct {
	mu      sync.Mutex
	conns   map[string]*goredis.Client // by master address: its pings and its subscription
	subs    map[string]*keyEventSub    // by master address
	healthy map[string]bool            // by master address: answered the last PING
}

// NodeHealth is one cluster master as the tier last saw it.
type NodeHealth struct {
	Addr    string
	Healthy bool
}

// Nodes returns the cluster's masters and their health, sorted by
// address; nil for a single server.
func (t *Tier) Nodes() []NodeHealth {
	if t.nodes == nil {
		return nil
	}
	t.nodes.mu.Lock()
	defer t.nodes.mu.Unlock()
	out := make([]NodeHealth, 0, len(t.nodes.healthy))
	for a, h := range t.nodes.healthy {
		out = append(out, NodeHealth{a, h})
	}
	slices.SortFunc(out, func(a, b NodeHealth) int {
		if a.Addr < b.Addr {
			return -1
		}
		if a.Addr > b.Addr {
			return 1
		}
		return 0
	})
	return out
}

// watchNodes refreshes the masters every probe interval until Close.
func (t *Tier) watchNodes() {
	defer t.wg.Done()
	tick := time.NewTicker(t.cfg.ProbeInterval)
	defer tick.Stop()
	defer func() {
		t.nodes.mu.Lock()
		subs, conns := t.nodes.subs, t.nodes.conns
		t.nodes.subs, t.nodes.conns = map[string]*keyEventSub{}, map[string]*goredis.Client{}
		t.nodes.mu.Unlock()
		for _, s := range subs {
			s.stop()
		}
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	for {
		select {
		case <-t.ctx.Done():
			return
		case <-tick.C:
			t.refreshNodes(t.ctx, false)
		}
	}
}

// refreshNodes reads the slot map (CLUSTER SLOTS from any node), pings
// each master and, with keyspace events, subscribes on new masters and
// unsubscribes from former ones. A failure to read the map keeps the
// previous view.
func (t *Tier) refreshNodes(ctx context.Context, initial bool) {
	cctx, cancel := context.WithTimeout(ctx, t.cfg.Timeout)
	slots, err := t.client.ClusterSlots(cctx).Result()
	cancel()
	if err != nil {
		t.log.Debug("cluster slot map not read", "err", err)
		return
	}
	masters := map[string]bool{}
	for _, s := range slots {
		if len(s.Nodes) > 0 && s.Nodes[0].Addr != "" {
			masters[s.Nodes[0].Addr] = true
		}
	}
	// One client per master, kept across refreshes: pings reuse its pool
	// instead of dialling every probe interval.
	t.nodes.mu.Lock()
	conns := make(map[string]*goredis.Client, len(masters))
	for a := range masters {
		if t.nodes.conns[a] == nil {
			t.nodes.conns[a] = goredis.NewClient(nodeOptions(t.cfg, a, t.tls))
		}
		conns[a] = t.nodes.conns[a]
	}
	var former []*goredis.Client
	for a, c := range t.nodes.conns {
		if !masters[a] {
			former = append(former, c)
			delete(t.nodes.conns, a)
		}
	}
	t.nodes.mu.Unlock()
	health := map[string]bool{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for a, c := range conns {
		wg.Go(func() {
			pctx, cancel := context.WithTimeout(ctx, t.cfg.DialTimeout+t.cfg.Timeout)
			defer cancel()
			ok := c.Ping(pctx).Err() == nil
			mu.Lock()
			health[a] = ok
			mu.Unlock()
		})
	}
	wg.Wait()

	t.nodes.mu.Lock()
	t.nodes.healthy = health
	var stale []*keyEventSub
	var added []string
	if t.cfg.KeyspaceEvents {
		for a, s := range t.nodes.subs {
			if !masters[a] {
				stale = append(stale, s)
				delete(t.nodes.subs, a)
			}
		}
		for a := range masters {
			if _, ok := t.nodes.subs[a]; !ok && health[a] {
				added = append(added, a)
			}
		}
	}
	t.nodes.mu.Unlock()
	for _, s := range stale {
		s.stop()
	}
	// A former master's client goes once its subscription has stopped.
	for _, c := range former {
		_ = c.Close()
	}
	for _, a := range added {
		c := conns[a]
		if !initial {
			// A promoted replica: make sure it publishes, and reconcile
			// what happened while no one was subscribed there.
			ectx, cancel := context.WithTimeout(ctx, t.cfg.Timeout)
			if err := t.enableOn(ectx, c); err != nil {
				t.log.Warn("keyspace events not enabled on a new master", "node", a, "err", err)
			}
			cancel()
			t.log.Info("following keyspace events of a new cluster master", "node", a)
		}
		s := t.subscribe(c, a)
		t.nodes.mu.Lock()
		t.nodes.subs[a] = s
		t.nodes.mu.Unlock()
	}
	if len(added) > 0 && !initial {
		t.recon.Trigger()
	}
}
