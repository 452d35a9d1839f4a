package redis

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/kvtier/kvtier/tiers/redis/slotmap"
	"github.com/kvtier/kvtier/tiers/remote"
)

// A cluster tier routes every block itself, on a slot map it owns, and
// tracks the health of each master apart: a master that dies takes only
// its own keys out (their lookups answer Miss, their loads fail and their
// stores are refused, at once), the other masters' keys keep hitting and
// storing. The tier as a whole is down only when no node answers CLUSTER
// SLOTS.
//
// The slot map is reloaded every probe_interval, at once (at most every
// 100ms) after a MOVED or ASK reply or a connection failure, and every
// 100ms while a master is down, so a failover is followed as soon as the
// cluster has promoted a replica. go-redis' client, which the tier uses
// for redirections and housekeeping, reads the same map (ClusterSlots).

// node is a server the tier sends blocks to: the single server, or one
// master of a cluster. Its health gates the blocks whose keys it holds.
type node struct {
	addr   string
	health *remote.Health
	// retry and probeRetry run its transfers and existence checks and
	// report their outcomes to health.
	retry, probeRetry *remote.Retrier
	// conn is the node's own client (pings, existence checks, keyspace
	// events); a single server's is the tier's client.
	conn *goredis.Client
	sub  *keyEventSub // keyspace events; nil when off
}

// cluster is the tier's view of a Redis Cluster.
type cluster struct {
	mu      sync.RWMutex
	slots   *slotmap.Map
	raw     []goredis.ClusterSlot // as read, for go-redis
	masters map[string]*node
	// known are clients of every address worth asking for the slot map:
	// the seeds, and the masters and replicas of the last map.
	known map[string]*goredis.Client

	kick    chan struct{} // asks for a reload now
	reloads atomic.Int64  // slot maps read that differed from the last
}

// minReload bounds how often the slot map is read when reloads are asked
// for (a burst of MOVED replies, a dead master).
const minReload = 100 * time.Millisecond

// newClient returns the client of cfg: a single-server client, or a
// cluster client whose slot map is slots'. Either way the tier retries
// itself (MaxRetries -1), so that it stops as soon as the server is
// marked down; a cluster client still follows MOVED/ASK redirections.
func newClient(cfg Config, tc *tls.Config, slots func(context.Context) ([]goredis.ClusterSlot, error)) goredis.UniversalClient {
	if cfg.Cluster {
		return goredis.NewClusterClient(&goredis.ClusterOptions{
			Addrs:                 cfg.seeds(),
			ClusterSlots:          slots,
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

// newNode returns the node of a cluster master at addr, healthy.
func (t *Tier) newNode(addr string, conn *goredis.Client) *node {
	n := &node{addr: addr, conn: conn}
	n.health = remote.NewHealth(fmt.Sprintf("%s node %s", t.label(), addr), func(ctx context.Context) error {
		return conn.Ping(ctx).Err()
	}, remote.HealthOptions{
		Threshold: t.cfg.UnhealthyAfter,
		Interval:  t.cfg.ProbeInterval,
		Timeout:   t.cfg.DialTimeout + t.cfg.Timeout,
		Logger:    t.log,
		OnRecover: func(ctx context.Context) {
			if t.cfg.KeyspaceEvents {
				// A restarted node forgot CONFIG SET, and what it dropped
				// meanwhile was published to no one.
				if err := t.enableOn(ctx, conn); err != nil {
					t.log.Warn("keyspace events not enabled on a recovered node", "node", addr, "err", err)
				}
			}
			t.recon.Trigger()
		},
	})
	n.retry = &remote.Retrier{Timeout: t.cfg.Timeout, Backoff: t.cfg.RetryBackoff, Health: n.health, Counters: &t.c, Classify: classify}
	n.probeRetry = &remote.Retrier{Timeout: t.cfg.LookupTimeout, Backoff: t.cfg.RetryBackoff, Health: n.health, Counters: &t.c, Classify: classify}
	return n
}

// close stops the node's probes and subscription; its client stays with
// the tier's known clients.
func (n *node) close() {
	if n.sub != nil {
		n.sub.stop()
	}
	n.health.Close()
}

// route returns the node that holds the server key key: the single
// server, or the master of its slot (nil when the slot has none).
func (t *Tier) route(key string) *node {
	if t.cl == nil {
		return t.single
	}
	t.cl.mu.RLock()
	defer t.cl.mu.RUnlock()
	return t.cl.masters[t.cl.slots.Master(key)]
}

// reloadSoon asks the watcher for a new slot map (non-blocking).
func (t *Tier) reloadSoon() {
	if t.cl == nil {
		return
	}
	select {
	case t.cl.kick <- struct{}{}:
	default:
	}
}

// NodeHealth is one cluster master as the tier last saw it.
type NodeHealth struct {
	Addr    string
	Healthy bool
}

// Nodes returns the cluster's masters and their health, sorted by
// address; nil for a single server.
func (t *Tier) Nodes() []NodeHealth {
	if t.cl == nil {
		return nil
	}
	t.cl.mu.RLock()
	out := make([]NodeHealth, 0, len(t.cl.masters))
	for a, n := range t.cl.masters {
		out = append(out, NodeHealth{a, n.health.Healthy()})
	}
	t.cl.mu.RUnlock()
	slices.SortFunc(out, func(a, b NodeHealth) int { return strings.Compare(a.Addr, b.Addr) })
	return out
}

// SlotMapReloads counts the slot maps read that differed from the
// previous one (a failover, a resharding); 0 for a single server.
func (t *Tier) SlotMapReloads() int64 {
	if t.cl == nil {
		return 0
	}
	return t.cl.reloads.Load()
}

// anyDown reports a master marked down.
func (c *cluster) anyDown() bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	for _, n := range c.masters {
		if !n.health.Healthy() {
			return true
		}
	}
	return false
}

// clusterSlots is go-redis' ClusterSlots: the tier's map, or, before the
// tier has one, a fresh read.
func (t *Tier) clusterSlots(ctx context.Context) ([]goredis.ClusterSlot, error) {
	t.cl.mu.RLock()
	raw := t.cl.raw
	t.cl.mu.RUnlock()
	if raw != nil {
		return raw, nil
	}
	return t.readSlots(ctx)
}

// readSlots asks the known nodes for the slot map, healthy masters first,
// then the seeds and the replicas, the masters marked down last, and
// returns the first answer.
func (t *Tier) readSlots(ctx context.Context) ([]goredis.ClusterSlot, error) {
	var first, last []string
	t.cl.mu.Lock()
	for _, a := range t.cfg.seeds() {
		if t.cl.known[a] == nil {
			t.cl.known[a] = goredis.NewClient(nodeOptions(t.cfg, a, t.tls))
		}
	}
	for a := range t.cl.known {
		if n := t.cl.masters[a]; n != nil && !n.health.Healthy() {
			last = append(last, a)
		} else if n != nil {
			first = append(first, a)
		} else {
			last = append([]string{a}, last...) // seeds and replicas before dead masters
		}
	}
	clients := make(map[string]*goredis.Client, len(t.cl.known))
	for a, c := range t.cl.known {
		clients[a] = c
	}
	t.cl.mu.Unlock()
	slices.Sort(first)
	var errs []error
	for _, a := range append(first, last...) {
		cctx, cancel := context.WithTimeout(ctx, t.cfg.Timeout)
		//lint:ignore SA1019 CLUSTER SLOTS is what Redis 6 and every Valkey answer (CLUSTER SHARDS is Redis 7's), and go-redis' ClusterSlots option takes its shape
		slots, err := clients[a].ClusterSlots(cctx).Result()
		cancel()
		if err == nil && len(slots) > 0 {
			return slots, nil
		}
		if err == nil {
			err = errors.New("no slots assigned")
		}
		errs = append(errs, fmt.Errorf("%s: %w", a, err))
		if ctx.Err() != nil {
			break
		}
	}
	return nil, fmt.Errorf("cluster slot map not read: %w", errors.Join(errs...))
}

// watchCluster follows the cluster until Close: a new slot map every
// probe interval, at once when asked (reloadSoon), and every minReload
// while a master is down.
func (t *Tier) watchCluster() {
	defer t.wg.Done()
	defer t.closeCluster()
	gap := min(t.cfg.ProbeInterval, minReload)
	timer := time.NewTimer(t.cfg.ProbeInterval)
	defer timer.Stop()
	last := time.Now()
	for {
		select {
		case <-t.ctx.Done():
			return
		case <-timer.C:
		case <-t.cl.kick:
			if d := gap - time.Since(last); d > 0 && !remote.Sleep(t.ctx, d) {
				return
			}
		}
		t.refreshCluster(t.ctx, false)
		last = time.Now()
		next := t.cfg.ProbeInterval
		if t.cl.anyDown() {
			next = gap
		}
		timer.Reset(next)
	}
}

// closeCluster stops every node and closes the known clients.
func (t *Tier) closeCluster() {
	t.cl.mu.Lock()
	masters, known := t.cl.masters, t.cl.known
	t.cl.masters, t.cl.known = map[string]*node{}, map[string]*goredis.Client{}
	t.cl.mu.Unlock()
	for _, n := range masters {
		n.close()
	}
	for _, c := range known {
		_ = c.Close()
	}
}

// refreshCluster reads the slot map and applies it: new masters get a
// node (and, with keyspace events, a subscription), former masters lose
// theirs, go-redis reloads its map when it changed, and each master is
// pinged. A map that cannot be read counts against the tier's health
// (the whole cluster is unreachable) and keeps the previous view.
func (t *Tier) refreshCluster(ctx context.Context, initial bool) {
	raw, err := t.readSlots(ctx)
	if err != nil {
		t.health.Failure(err)
		t.log.Debug("cluster slot map not read", "err", err)
		return
	}
	t.health.Success()
	masters, changed := t.applySlots(raw)
	if changed && !initial {
		t.cl.reloads.Add(1)
		if cc, ok := t.client.(*goredis.ClusterClient); ok {
			cc.ReloadState(ctx)
		}
		t.log.Info("cluster slot map changed", "masters", strings.Join(t.cl.slots.Masters(), ","), "slots_covered", t.cl.slots.Covered())
	}
	answered := t.pingMasters(ctx, masters)
	if t.cfg.KeyspaceEvents {
		t.followKeyEvents(ctx, masters, answered, initial)
	}
}

// applySlots makes raw the tier's slot map: a node for each new master,
// the nodes of former masters closed, clients kept only for the seeds
// and the map's nodes. It returns the masters and whether the map routes
// otherwise than before.
func (t *Tier) applySlots(raw []goredis.ClusterSlot) (masters map[string]*node, changed bool) {
	var ranges []slotmap.Range
	addrs := map[string]bool{}
	for _, s := range raw {
		for _, nd := range s.Nodes {
			if nd.Addr != "" {
				addrs[nd.Addr] = true
			}
		}
		if len(s.Nodes) > 0 && s.Nodes[0].Addr != "" {
			ranges = append(ranges, slotmap.Range{Start: int(s.Start), End: int(s.End), Master: s.Nodes[0].Addr})
		}
	}
	slots := slotmap.New(ranges)

	t.cl.mu.Lock()
	changed = !sameSlots(t.cl.raw, raw)
	var former []*node
	masters = make(map[string]*node, len(slots.Masters()))
	for _, a := range slots.Masters() {
		n := t.cl.masters[a]
		if n == nil {
			c := t.cl.known[a]
			if c == nil {
				c = goredis.NewClient(nodeOptions(t.cfg, a, t.tls))
				t.cl.known[a] = c
			}
			n = t.newNode(a, c)
		}
		masters[a] = n
	}
	for a, n := range t.cl.masters {
		if masters[a] == nil {
			former = append(former, n)
		}
	}
	// Forget clients of addresses that are neither seeds nor in the map.
	for a, c := range t.cl.known {
		if !addrs[a] && !slices.Contains(t.cfg.seeds(), a) {
			_ = c.Close()
			delete(t.cl.known, a)
		}
	}
	for a := range addrs {
		if t.cl.known[a] == nil {
			t.cl.known[a] = goredis.NewClient(nodeOptions(t.cfg, a, t.tls))
		}
	}
	t.cl.slots, t.cl.raw, t.cl.masters = slots, raw, masters
	t.cl.mu.Unlock()

	for _, n := range former {
		n.close()
	}
	return masters, changed
}

// pingMasters pings every master at once, reporting each outcome to its
// node's health, and returns those that answered.
func (t *Tier) pingMasters(ctx context.Context, masters map[string]*node) map[*node]bool {
	var mu sync.Mutex
	answered := make(map[*node]bool, len(masters))
	var wg sync.WaitGroup
	for _, n := range masters {
		wg.Go(func() {
			pctx, cancel := context.WithTimeout(ctx, t.cfg.DialTimeout+t.cfg.Timeout)
			defer cancel()
			if err := n.conn.Ping(pctx).Err(); err != nil {
				if ctx.Err() == nil {
					n.health.Failure(err)
				}
				return
			}
			n.health.Success()
			mu.Lock()
			answered[n] = true
			mu.Unlock()
		})
	}
	wg.Wait()
	return answered
}

// followKeyEvents subscribes to the keyspace events of every master that
// answered and has no subscription yet. Subscriptions are the watcher's:
// only it (and New, before it starts) reads or writes n.sub.
func (t *Tier) followKeyEvents(ctx context.Context, masters map[string]*node, answered map[*node]bool, initial bool) {
	subscribed := 0
	for _, n := range masters {
		if n.sub != nil || !answered[n] {
			continue
		}
		if !initial {
			// A promoted replica, or a master that was down at start:
			// make sure it publishes, and reconcile what happened while
			// no one was subscribed there.
			ectx, cancel := context.WithTimeout(ctx, t.cfg.Timeout)
			if err := t.enableOn(ectx, n.conn); err != nil {
				t.log.Warn("keyspace events not enabled on a new master", "node", n.addr, "err", err)
			}
			cancel()
			t.log.Info("following keyspace events of a cluster master", "node", n.addr)
		}
		n.sub = t.subscribe(n.conn, n.addr)
		subscribed++
	}
	if subscribed > 0 && !initial {
		t.recon.Trigger()
	}
}

// sameSlots reports whether two CLUSTER SLOTS answers route alike.
func sameSlots(a, b []goredis.ClusterSlot) bool {
	return slices.EqualFunc(a, b, func(x, y goredis.ClusterSlot) bool {
		return x.Start == y.Start && x.End == y.End && len(x.Nodes) > 0 && len(y.Nodes) > 0 && x.Nodes[0].Addr == y.Nodes[0].Addr
	})
}
