package redis

import (
	"context"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	goredis "github.com/redis/go-redis/v9"

	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/tiers/redis/slotpipe"
	"github.com/kvtier/kvtier/tiers/remote"
)

// Type is the configured type name of the tier.
const Type = "redis"

// ErrUnreachable reports a server that did not answer at startup.
var ErrUnreachable = errors.New("server unreachable")

// ErrNotFound reports a block the server does not hold (never stored,
// evicted or expired).
var ErrNotFound = remote.ErrNotFound

// ErrValueTooLarge reports a block whose envelope exceeds max_value_bytes.
var ErrValueTooLarge = errors.New("value exceeds max_value_bytes")

// Tier is a Redis or Valkey server as a (usually remote) CPU secondary
// tier. It implements offload.SecondaryTier; the embedded remote.Base
// does the bookkeeping common to remote tiers.
type Tier struct {
	*remote.Base
	cfg Config
	log *slog.Logger

	client goredis.UniversalClient // *goredis.Client, or *goredis.ClusterClient with Cluster
	tls    *tls.Config             // of every connection; nil: plain TCP
	// pipes are the tier's own connections for stores straight from the
	// slots (package slotpipe); nil: every store goes through client.
	pipes *slotpipe.Pools
	// health is the tier's: a single server's, or a cluster's as a whole
	// (down when no node answers CLUSTER SLOTS). It gates every lookup
	// and job (remote.Base).
	health *remote.Health
	// single is a single server as a node (its health is the tier's);
	// nil with Cluster.
	single *node
	// cl is a cluster's slot map and masters, each a node with a health
	// of its own (nil for a single server).
	cl    *cluster
	ioSem chan struct{} // bounds concurrent transfer pipelines

	// budget is max_bytes' ledger (nil without max_bytes).
	budget *remote.Budget

	events        *remote.Events     // nil when events are off
	recon         *remote.Reconciler // nil when events are off
	c             remote.Counters
	serverRemoved atomic.Int64
	// notify is set while the server is known to publish the key events
	// the tier subscribed to; the tier then leaves removed events for its
	// own deletions to the subscription.
	notify atomic.Bool

	touches chan []offload.Key

	ctx    context.Context // canceled by Close; background goroutines
	cancel context.CancelFunc
	wg     sync.WaitGroup

	closeOnce sync.Once
	closeErr  error
}

var _ offload.SecondaryTier = (*Tier)(nil)

// New validates cfg, connects and pings the server: an unreachable server
// or failed authentication is an error naming the address. ctx bounds the
// startup checks.
func New(ctx context.Context, cfg Config) (*Tier, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	t := &Tier{
		cfg:     cfg,
		log:     cfg.Logger,
		ioSem:   make(chan struct{}, cfg.PoolSize),
		touches: make(chan []offload.Key, 64),
	}
	if t.log == nil {
		t.log = slog.Default()
	}
	t.log = t.log.With("tier", cfg.Name, "type", Type)
	var err error
	if t.budget, err = cfg.NewBudget(); err != nil {
		return nil, fmt.Errorf("%s: %w", t.label(), err)
	}
	if err := t.connect(ctx); err != nil {
		return nil, err
	}
	t.ctx, t.cancel = context.WithCancel(context.Background())
	t.startBase()
	switch {
	case cfg.Cluster:
		if cfg.KeyspaceEvents {
			t.enableNotifications(ctx)
		}
		t.refreshCluster(ctx, true)
		t.wg.Add(1)
		go t.watchCluster()
	case cfg.KeyspaceEvents:
		t.enableNotifications(ctx)
		t.single.sub = t.subscribe(t.client, "")
	}
	t.wg.Add(1)
	go t.touchLoop()
	if t.budget != nil {
		if err := t.budget.Fill(ctx, t.list, t.del, t.log); err != nil {
			t.Close(context.Background())
			return nil, fmt.Errorf("%s: %w", t.label(), err)
		}
	}
	return t, nil
}

// connect builds the clients (go-redis' and the tier's own connections)
// and pings the server: an unreachable server (ErrUnreachable) or a
// refused login is an error naming the addresses, with nothing left open.
func (t *Tier) connect(ctx context.Context) error {
	cfg := t.cfg
	var err error
	if t.tls, err = cfg.TLS.Config(); err != nil {
		return fmt.Errorf("%s: tls: %w", t.label(), err)
	}
	if cfg.Cluster {
		t.cl = &cluster{masters: map[string]*node{}, known: map[string]*goredis.Client{}, kick: make(chan struct{}, 1)}
	}
	t.client = newClient(cfg, t.tls, t.clusterSlots)
	t.pipes = slotpipe.New(slotpipe.Options{
		Username:    cfg.Username,
		Password:    cfg.Password,
		DB:          cfg.DB,
		TLS:         t.tls,
		DialTimeout: cfg.DialTimeout,
		Timeout:     cfg.Timeout,
		MaxIdle:     cfg.PoolSize,
	})
	pctx, cancel := context.WithTimeout(ctx, cfg.DialTimeout+cfg.Timeout)
	err = t.client.Ping(pctx).Err()
	cancel()
	if err == nil {
		return nil
	}
	t.client.Close()
	t.pipes.Close()
	if t.cl != nil {
		t.closeCluster()
	}
	var re goredis.Error
	if errors.As(err, &re) {
		return fmt.Errorf("%s: %s: %w", t.label(), strings.Join(cfg.seeds(), ","), err)
	}
	return fmt.Errorf("%s: %s: %w: %w", t.label(), strings.Join(cfg.seeds(), ","), ErrUnreachable, err)
}

// startBase starts what every remote tier has: the health gate (a single
// server's, or a cluster's as a whole), the job table and existence
// checks (remote.Base) and, with events, reconciliation.
func (t *Tier) startBase() {
	cfg := t.cfg
	loc, _ := remote.ParseLocality(cfg.Locality)
	if cfg.Events {
		t.events = remote.NewEvents(cfg.Name, offload.MediumCPU, loc, 0)
	}
	t.health = remote.NewHealth(t.label(), t.probe, remote.HealthOptions{
		Threshold: cfg.UnhealthyAfter,
		Interval:  cfg.ProbeInterval,
		Timeout:   cfg.DialTimeout + cfg.Timeout,
		Logger:    t.log,
		OnRecover: func(ctx context.Context) {
			// A restarted server forgot CONFIG SET; enable again.
			if cfg.KeyspaceEvents {
				t.enableNotifications(ctx)
			}
			// It may also have forgotten the data, without a word.
			t.recon.Trigger()
		},
	})
	if !cfg.Cluster {
		t.single = &node{
			addr:       cfg.Addr,
			health:     t.health,
			retry:      &remote.Retrier{Timeout: cfg.Timeout, Backoff: cfg.RetryBackoff, Health: t.health, Counters: &t.c, Classify: classify},
			probeRetry: &remote.Retrier{Timeout: cfg.LookupTimeout, Backoff: cfg.RetryBackoff, Health: t.health, Counters: &t.c, Classify: classify},
			conn:       t.client.(*goredis.Client),
		}
	}
	t.Base = remote.NewBase(remote.BaseConfig{
		Name:          cfg.Name,
		Label:         t.label(),
		Medium:        offload.MediumCPU,
		Locality:      loc,
		Health:        t.health,
		Counters:      &t.c,
		Events:        t.events,
		MaxInflight:   cfg.MaxInflight,
		Exists:        t.exists,
		LookupBatch:   cfg.LookupBatch,
		LookupTimeout: cfg.LookupTimeout,
		Logger:        t.log,
		Store:         t.store,
		Load:          t.load,
		Budget:        t.budget,
		Delete:        t.del,
	})
	t.recon = remote.StartReconciler(t.ctx, &t.wg, remote.ReconcilerConfig{
		Events:   t.events,
		Check:    t.exists,
		Options:  remote.ReconcileOptions{Batch: cfg.LookupBatch, Rate: cfg.ReconcileRate},
		Interval: cfg.ReconcileInterval,
		Healthy:  t.health.Healthy,
		Logger:   t.log,
	})
}

func (t *Tier) label() string { return fmt.Sprintf("redis tier %q", t.cfg.Name) }

// probe checks the server: a single server answers PING, a cluster its
// slot map (from any node).
func (t *Tier) probe(ctx context.Context) error {
	if t.cl != nil {
		_, err := t.readSlots(ctx)
		return err
	}
	return t.client.Ping(ctx).Err()
}

// classify: a server error reply shows a working server unless it says
// the server is not ready; everything else (network, timeouts, pool
// exhaustion) is transient.
func classify(err error) remote.Class {
	if errors.Is(err, goredis.Nil) || errors.Is(err, remote.ErrCorrupt) || errors.Is(err, remote.ErrSizeMismatch) {
		return remote.Answered
	}
	var re goredis.Error
	if errors.As(err, &re) {
		for _, p := range []string{"LOADING", "BUSY", "TRYAGAIN", "MASTERDOWN", "CLUSTERDOWN"} {
			if goredis.HasErrorPrefix(err, p) {
				return remote.Transient
			}
		}
		return remote.Answered
	}
	return remote.Transient
}

// Type returns "redis".
func (t *Tier) Type() string { return Type }

// Reconcile runs one reconciliation pass now (see remote.Events.Reconcile)
// and returns how many keys it checked and removals it published.
func (t *Tier) Reconcile(ctx context.Context) (checked, removed int, err error) {
	return t.events.Reconcile(ctx, t.exists, remote.ReconcileOptions{Batch: t.cfg.LookupBatch, Rate: t.cfg.ReconcileRate})
}

// Stats returns the tier's counters and gauges.
func (t *Tier) Stats() Stats {
	st := t.Base.Stats()
	rs := t.recon.Stats()
	st.Reconciles, st.ReconcileFailures, st.ReconciledRemovals = rs.Runs, rs.Failed, rs.Removed
	return Stats{Stats: st, ServerRemoved: t.serverRemoved.Load(), KeyspaceEvents: t.notify.Load()}
}

// Report implements offload.Reporter: the common remote figures, the
// blocks the server itself evicted, expired or deleted (keyspace events)
// as the tier's evictions, and a cluster's masters.
func (t *Tier) Report() offload.TierReport {
	st := t.Stats()
	r := remote.ReportOf(st.Stats)
	r.Evictions = uint64(st.ServerRemoved)
	for _, n := range t.Nodes() {
		r.Remote.Nodes = append(r.Remote.Nodes, offload.NodeReport{Addr: n.Addr, Healthy: n.Healthy})
	}
	r.Remote.SlotMapChanges = uint64(t.SlotMapReloads())
	// With max_bytes the ledger is the occupancy, and the evictions are
	// its deletions (the server's own would count them twice as del
	// notifications).
	t.budget.AddTo(&r)
	return r
}

// Stats adds the Redis-specific figures to the common remote tier stats.
type Stats struct {
	remote.Stats
	// ServerRemoved counts blocks the server reported evicted, expired
	// or deleted through keyspace events.
	ServerRemoved int64
	// KeyspaceEvents is true while the server is known to publish them.
	KeyspaceEvents bool
}

// redisKey is the server key of k: prefix, hex hash, ':' and group.
func (t *Tier) redisKey(k offload.Key) string {
	h := k.HexHash()
	var sb strings.Builder
	sb.Grow(len(t.cfg.KeyPrefix) + len(h) + 11)
	sb.WriteString(t.cfg.KeyPrefix)
	sb.WriteString(h)
	sb.WriteByte(':')
	sb.WriteString(strconv.FormatUint(uint64(k.Group()), 10))
	return sb.String()
}

// parseKey inverts redisKey; ok is false for keys not written by a tier
// with this prefix.
func (t *Tier) parseKey(s string) (offload.Key, bool) {
	rest, ok := strings.CutPrefix(s, t.cfg.KeyPrefix)
	if !ok {
		return "", false
	}
	i := strings.LastIndexByte(rest, ':')
	if i <= 0 {
		return "", false
	}
	h, err := hex.DecodeString(rest[:i])
	if err != nil {
		return "", false
	}
	g, err := strconv.ParseUint(rest[i+1:], 10, 32)
	if err != nil {
		return "", false
	}
	k := offload.MakeKey(h, uint32(g))
	return k, k.Valid()
}

// Touch refreshes the blocks on the server in the background: their TTL
// when one is configured, else their LRU clock (TOUCH), so blocks the
// engine keeps using are the last the server evicts. It never blocks; a
// touch that finds the queue full is dropped.
func (t *Tier) Touch(keys []offload.Key, _ *offload.ReqContext) {
	if t.budget != nil {
		t.budget.Touch(keys)
	}
	if len(keys) == 0 || !t.health.Healthy() {
		return
	}
	select {
	case t.touches <- append([]offload.Key(nil), keys...):
	default:
	}
}

func (t *Tier) touchLoop() {
	defer t.wg.Done()
	for {
		select {
		case <-t.ctx.Done():
			return
		case keys := <-t.touches:
			ctx, cancel := context.WithTimeout(t.ctx, t.cfg.Timeout)
			pipe := t.client.Pipeline()
			for _, k := range keys {
				if n := t.route(t.redisKey(k)); n == nil || !n.health.Healthy() {
					continue // its node is down: touching it would only wait
				}
				if t.cfg.TTL > 0 {
					pipe.PExpire(ctx, t.redisKey(k), t.cfg.TTL)
				} else {
					pipe.Touch(ctx, t.redisKey(k))
				}
			}
			pipe.Exec(ctx) // best effort: a failed touch only ages the block
			cancel()
		}
	}
}

// Close cancels running transfers, waits for them until ctx ends, answers
// every outstanding job, stops the subscription and closes the
// connections. It is idempotent.
func (t *Tier) Close(ctx context.Context) error {
	t.closeOnce.Do(func() {
		t.closeErr = t.Base.Close(ctx)
		t.cancel()
		t.wg.Wait()
		if t.single != nil && t.single.sub != nil {
			t.single.sub.stop()
		}
		t.pipes.Close()
		if err := t.client.Close(); err != nil && t.closeErr == nil {
			t.closeErr = fmt.Errorf("%s: close: %w", t.label(), err)
		}
	})
	return t.closeErr
}

// exists is the asynclookup batch function: one pipeline of EXISTS per
// node, on the node's own connection. The keys of a node marked down
// answer false without a word to it; those of a node whose pipeline
// failed answer false too (and count as probe errors); the batch fails
// only when no node answered.
func (t *Tier) exists(ctx context.Context, keys []offload.Key) ([]bool, error) {
	if !t.health.Healthy() {
		return nil, fmt.Errorf("%s: %w", t.label(), remote.ErrUnavailable)
	}
	t.c.Probes.Add(int64(len(keys)))
	found := make([]bool, len(keys))
	idx := make([]int, len(keys))
	for i := range idx {
		idx[i] = i
	}
	var mu sync.Mutex
	var first error
	failed := 0
	down := t.eachNode(ctx, keys, idx, func(ctx context.Context, n *node, idx []int) {
		if err := t.existsOn(ctx, n, keys, idx, found); err != nil {
			mu.Lock()
			failed += len(idx)
			first = cmp(first, err)
			mu.Unlock()
		}
	})
	t.c.LookupsUnhealthy.Add(int64(len(down)))
	if failed > 0 {
		t.c.ProbeErrors.Add(int64(failed))
		if failed+len(down) == len(keys) {
			return nil, fmt.Errorf("%s: exists: %w", t.label(), first)
		}
	}
	return found, nil
}

// existsOn checks the keys idx on node n. A key answered with an error
// (a MOVED during a failover) is not found, and asks for a new slot map.
func (t *Tier) existsOn(ctx context.Context, n *node, keys []offload.Key, idx []int, found []bool) error {
	var cmds []*goredis.IntCmd
	err := n.probeRetry.Do(ctx, 0, func(ctx context.Context) error {
		pipe := n.conn.Pipeline()
		cmds = make([]*goredis.IntCmd, len(idx))
		for j, i := range idx {
			cmds[j] = pipe.Exists(ctx, t.redisKey(keys[i]))
		}
		_, err := pipe.Exec(ctx)
		return err
	})
	if err != nil && isTransport(err) {
		t.reloadSoon()
		return err
	}
	if err != nil && isRedirect(err) {
		t.reloadSoon()
	}
	for j, i := range idx {
		found[i] = cmds[j].Err() == nil && cmds[j].Val() > 0
	}
	return nil
}

// Keep passes over the blocks keep reports when max_bytes makes the tier
// choose victims (offload.Keeper: routers' pins); without max_bytes it
// chooses none.
func (t *Tier) Keep(keep func(offload.Key) bool) {
	if t.budget != nil {
		t.budget.Keep(keep)
	}
}
