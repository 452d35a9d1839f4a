package redis

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/kvtier/kvtier/confvalue"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/quota"
	"github.com/kvtier/kvtier/tiers/remote"
	rt "github.com/kvtier/kvtier/tiers/remote/remotetest"
)

// Integration tests run against a real redis-server: the shared one named
// by KVTIER_TEST_REDIS_ADDR, and for tests that reconfigure or stop the
// server, a redis-server process of their own (binary on PATH). Without
// them they skip, unless KVTIER_REQUIRE_INTEGRATION=1.

// sharedRedisConfig points at $KVTIER_TEST_REDIS_ADDR with a key prefix of
// its own, whose keys are removed after the test.
func sharedRedisConfig(t *testing.T) Config {
	t.Helper()
	addr := os.Getenv("KVTIER_TEST_REDIS_ADDR")
	if addr == "" {
		rt.RequireIntegration(t, "KVTIER_TEST_REDIS_ADDR")
	}
	cfg := itConfig(addr)
	t.Cleanup(func() { removePrefix(addr, cfg.KeyPrefix) })
	return cfg
}

func itConfig(addr string) Config {
	cfg := DefaultConfig()
	cfg.Name = "redis-it"
	cfg.Addr = addr
	cfg.KeyPrefix = rt.UniqueName() + ":"
	cfg.Locality = "remote"
	cfg.Events = true
	cfg.Timeout = 2 * time.Second
	cfg.DialTimeout = time.Second
	cfg.RetryBackoff = 5 * time.Millisecond
	cfg.ProbeInterval = 50 * time.Millisecond
	cfg.Logger = slog.New(slog.DiscardHandler)
	return cfg
}

func removePrefix(addr, prefix string) {
	c := goredis.NewClient(&goredis.Options{Addr: addr})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	it := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	for it.Next(ctx) {
		c.Del(ctx, it.Val())
	}
}

// redisServer is a redis-server process the test owns.
type redisServer struct {
	*rt.Process
	t    testing.TB
	addr string
}

func startRedis(t testing.TB, extra ...string) *redisServer {
	t.Helper()
	return startRedisOn(t, nil, func(port string) []string { return append([]string{"--port", port}, extra...) })
}

// startRedisOn starts a redis-server on a free loopback port with the
// arguments args(port) returns, and waits until it answers a PING (over
// TLS with tc).
func startRedisOn(t testing.TB, tc *tls.Config, args func(port string) []string) *redisServer {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		rt.RequireIntegration(t, "redis-server on PATH")
	}
	p := &redisServer{t: t, addr: rt.FreeAddr(t)}
	host, port, _ := net.SplitHostPort(p.addr)
	argv := append([]string{bin, "--bind", host, "--save", "", "--appendonly", "no", "--dir", t.TempDir()}, args(port)...)
	p.Process = rt.StartProcess(t, "redis-server", argv, func() error {
		c := goredis.NewClient(&goredis.Options{Addr: p.addr, MaxRetries: -1, TLSConfig: tc})
		defer c.Close()
		return c.Ping(context.Background()).Err()
	}, 10*time.Second)
	return p
}

// roundTrip stores blocks of slot bytes under keys, perJob blocks per
// store job, then checks that each looks up Hit and that one load job
// reads every block back as it was.
func roundTrip(t *testing.T, tier *Tier, keys []offload.Key, slot, perJob int) {
	t.Helper()
	n := len(keys)
	src := rt.NewArena(slot, n)
	for i := range n {
		src.Fill(int64(i), uint64(i+1))
	}
	for j := 0; j < n; j += perJob {
		m := min(perJob, n-j)
		if res := rt.Run(t, tier, rt.StoreJob(uint64(j+1), src, keys[j:j+m], rt.Slots(j, m))); !res.Success {
			t.Fatalf("store of blocks %d to %d: %+v", j, j+m-1, res)
		}
	}
	req, _ := offload.NewReqContext("round-trip", nil)
	for _, k := range keys {
		if r := rt.Resolve(t, tier, k, req); r != offload.Hit {
			t.Fatalf("lookup %s: %v", k, r)
		}
	}
	dst := rt.NewArena(slot, n)
	if res := rt.Run(t, tier, rt.LoadJob(uint64(n+1), dst, keys, rt.Slots(0, n), req)); !res.Success {
		t.Fatalf("load: %+v", res)
	}
	for i := range int64(n) {
		a, _ := src.Slot(i)
		b, _ := dst.Slot(i)
		if !bytes.Equal(a, b) {
			t.Fatalf("block %d read back other bytes", i)
		}
	}
}

func (p *redisServer) client() *goredis.Client {
	c := goredis.NewClient(&goredis.Options{Addr: p.addr})
	p.t.Cleanup(func() { c.Close() })
	return c
}

func TestIntegrationRoundTrip2MiB(t *testing.T) {
	cfg := sharedRedisConfig(t)
	tier := newTier(t, cfg)
	const n = 6
	roundTrip(t, tier, rt.Keys(300, n), 2<<20, n)
	if evs := tier.TakeEvents(); len(evs) != 1 || len(evs[0].Keys) != n {
		t.Fatalf("events %+v", evs)
	}
}

// A block the manager takes back before the tier reads it is not SET.
func TestIntegrationTakenBack(t *testing.T) {
	tier := newTier(t, sharedRedisConfig(t))
	src := rt.NewArena(4096, 3)
	rt.CheckTakenBack(t, tier, src, rt.Keys(700, 3), true)
}

func TestIntegrationCorruptValue(t *testing.T) {
	cfg := sharedRedisConfig(t)
	tier := newTier(t, cfg)
	raw := goredis.NewClient(&goredis.Options{Addr: cfg.Addr})
	defer raw.Close()
	ctx := context.Background()
	src := rt.NewArena(64<<10, 1)
	src.Fill(0, 9)
	keys := rt.Keys(1, 1)
	if res := rt.Run(t, tier, rt.StoreJob(1, src, keys, []int64{0})); !res.Success {
		t.Fatal(res)
	}
	rk := tier.redisKey(keys[0])
	// Flip one payload byte in place, as bit rot would.
	b, err := raw.GetRange(ctx, rk, remote.HeaderSize+500, remote.HeaderSize+500).Bytes()
	if err != nil {
		t.Fatal(err)
	}
	raw.SetRange(ctx, rk, remote.HeaderSize+500, string([]byte{b[0] ^ 1}))
	req, _ := offload.NewReqContext("c", nil)
	if r := rt.Resolve(t, tier, keys[0], req); r != offload.Hit {
		t.Fatal(r)
	}
	res := rt.Run(t, tier, rt.LoadJob(2, rt.NewArena(64<<10, 1), keys, []int64{0}, req))
	if res.Success || !errors.Is(res.Err, remote.ErrCorrupt) {
		t.Fatalf("load %+v", res)
	}
	if r := tier.Lookup(keys[0], req); r != offload.Miss {
		t.Fatalf("lookup after corrupt load %v", r)
	}
	if n, _ := raw.Exists(ctx, rk).Result(); n != 0 {
		t.Fatal("corrupt value not deleted")
	}
	if st := tier.Stats(); st.Corrupted != 1 || st.Deleted != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// removedKeys collects the keys of removed events until want are seen.
func waitRemoved(t *testing.T, tier *Tier, want map[offload.Key]bool, timeout time.Duration) {
	t.Helper()
	if missing := awaitRemoved(t, tier, want, timeout); missing > 0 {
		t.Fatalf("%d keys never reported removed", missing)
	}
}

// awaitRemoved takes the tier's events until every key of want was
// reported removed or timeout passes, and returns how many never were.
func awaitRemoved(t *testing.T, tier *Tier, want map[offload.Key]bool, timeout time.Duration) int {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for len(want) > 0 {
		for _, ev := range tier.TakeEvents() {
			if !ev.Removed {
				continue
			}
			if ev.Medium != offload.MediumCPU || ev.Locality != offload.LocalityRemote || ev.Tier != tier.Name() {
				t.Fatalf("removed event %+v", ev)
			}
			for _, k := range ev.Keys {
				delete(want, k)
			}
		}
		if time.Now().After(deadline) {
			return len(want)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return 0
}

func TestIntegrationKeyspaceRemovals(t *testing.T) {
	p := startRedis(t, "--maxmemory", "24mb", "--maxmemory-policy", "allkeys-lru")
	cfg := itConfig(p.addr)
	cfg.KeyspaceEvents = true
	tier := newTier(t, cfg)
	if !tier.Stats().KeyspaceEvents {
		t.Fatal("keyspace events not enabled on a server that allows CONFIG SET")
	}
	raw := p.client()
	ctx := context.Background()

	// An explicit DEL by someone else is reported.
	arena := rt.NewArena(1<<20, 40)
	keys := rt.Keys(0, 40)
	if res := rt.Run(t, tier, rt.StoreJob(1, arena, keys[:1], []int64{0})); !res.Success {
		t.Fatal(res)
	}
	raw.Del(ctx, tier.redisKey(keys[0]))
	waitRemoved(t, tier, map[offload.Key]bool{keys[0]: true}, 5*time.Second)

	// maxmemory evictions are reported: 39 MiB into a 24 MiB server.
	for i := 1; i < 40; i++ {
		if res := rt.Run(t, tier, rt.StoreJob(uint64(i+1), arena, keys[i:i+1], []int64{int64(i)})); !res.Success {
			t.Fatalf("store %d: %+v", i, res)
		}
	}
	evicted := map[offload.Key]bool{}
	for _, k := range keys[1:] {
		if n, _ := raw.Exists(ctx, tier.redisKey(k)).Result(); n == 0 {
			evicted[k] = true
		}
	}
	if len(evicted) == 0 {
		t.Fatal("server evicted nothing; maxmemory not in effect")
	}
	waitRemoved(t, tier, evicted, 5*time.Second)
	if st := tier.Stats(); st.ServerRemoved < int64(len(evicted))+1 {
		t.Fatalf("stats %+v", st)
	}

	// Expiry is reported.
	k := rt.Key(1000)
	if res := rt.Run(t, tier, rt.StoreJob(2, rt.NewArena(1024, 1), []offload.Key{k}, []int64{0})); !res.Success {
		t.Fatal(res)
	}
	raw.PExpire(ctx, tier.redisKey(k), 100*time.Millisecond)
	// An access expires a key whose TTL has passed at once.
	rt.Eventually(t, 10*time.Second, "the key to expire", func() bool {
		n, err := raw.Exists(ctx, tier.redisKey(k)).Result()
		return err == nil && n == 0
	})
	waitRemoved(t, tier, map[offload.Key]bool{k: true}, 5*time.Second)

	// A restarted server forgot CONFIG SET; the tier enables events again.
	p.Stop()
	rt.Eventually(t, 10*time.Second, "unhealthy", func() bool {
		tier.SubmitStore(rt.StoreJob(500, arena, keys[:1], []int64{0}))
		rt.WaitJobs(t, tier, 1, 10*time.Second)
		return !tier.Healthy()
	})
	p.Start()
	rt.Eventually(t, 10*time.Second, "healthy", tier.Healthy)
	flags, err := raw.ConfigGet(ctx, "notify-keyspace-events").Result()
	if err != nil || missingFlags(flags["notify-keyspace-events"]) != "" {
		t.Fatalf("after restart notify-keyspace-events = %v (%v)", flags, err)
	}
	// The client resubscribes on its own schedule after the restart, and a
	// removal published before that is lost (pub/sub keeps nothing), so
	// delete again until one is reported.
	job := uint64(600)
	rt.Eventually(t, 15*time.Second, "a removal reported after the restart", func() bool {
		job++
		if res := rt.Run(t, tier, rt.StoreJob(job, arena, keys[:1], []int64{0})); !res.Success {
			t.Fatal(res)
		}
		tier.TakeEvents()
		raw.Del(ctx, tier.redisKey(keys[0]))
		return awaitRemoved(t, tier, map[offload.Key]bool{keys[0]: true}, time.Second) == 0
	})
}

func TestIntegrationServerStoppedAndRestarted(t *testing.T) {
	p := startRedis(t)
	cfg := itConfig(p.addr)
	cfg.Retries = 1
	tier := newTier(t, cfg)
	const slot = 1 << 20
	arena := rt.NewArena(slot, 4)
	for i := 0; i < 4; i++ {
		arena.Fill(int64(i), uint64(i))
	}
	keys := rt.Keys(0, 2)
	if res := rt.Run(t, tier, rt.StoreJob(1, arena, keys, rt.Slots(0, 2))); !res.Success {
		t.Fatal(res)
	}
	p.Stop()
	rt.StoreUntilDown(t, tier, arena, 2, 10, 10*time.Second)
	req, _ := offload.NewReqContext("down", nil)
	if r := tier.Lookup(keys[0], req); r != offload.Miss {
		t.Fatalf("lookup while down %v", r)
	}
	tier.SubmitStore(rt.StoreJob(100, arena, keys, rt.Slots(0, 2)))
	if r := rt.WaitJobs(t, tier, 1, 10*time.Second)[0]; !errors.Is(r.Err, remote.ErrUnavailable) {
		t.Fatalf("cascade while down %+v", r)
	}
	if st := tier.Stats(); st.Healthy || st.StoreJobsSkipped != 1 || st.Downs != 1 {
		t.Fatalf("stats %+v", st)
	}

	p.Start() // no persistence: the server comes back empty
	rt.Eventually(t, 10*time.Second, "healthy after restart", tier.Healthy)
	req2, _ := offload.NewReqContext("up", nil)
	if r := rt.Resolve(t, tier, keys[0], req2); r != offload.Miss {
		t.Fatalf("lookup on the empty restarted server %v", r)
	}
	if res := rt.Run(t, tier, rt.StoreJob(200, arena, keys, rt.Slots(0, 2))); !res.Success {
		t.Fatalf("store after restart %+v", res)
	}
	req3, _ := offload.NewReqContext("again", nil)
	if r := rt.Resolve(t, tier, keys[1], req3); r != offload.Hit {
		t.Fatalf("lookup after re-store %v", r)
	}
	dst := rt.NewArena(slot, 2)
	if res := rt.Run(t, tier, rt.LoadJob(201, dst, keys, rt.Slots(0, 2), req3)); !res.Success {
		t.Fatalf("load after restart %+v", res)
	}
	a, _ := arena.Slot(1)
	b, _ := dst.Slot(1)
	if !bytes.Equal(a, b) {
		t.Fatal("block differs after restart")
	}
}

func TestIntegrationManagerOutage(t *testing.T) {
	p := startRedis(t)
	tier := newTier(t, itConfig(p.addr))
	rt.RunManagerOutage(t, rt.ManagerCase{Tier: tier}, rt.Outage{Stop: p.Stop, Start: p.Start, Healthy: tier.Healthy})
}

func TestIntegrationDeleteThroughManager(t *testing.T) {
	rt.RunManagerDelete(t, rt.ManagerCase{Tier: newTier(t, sharedRedisConfig(t))})
}

func TestIntegrationThroughManager(t *testing.T) {
	tier := newTier(t, sharedRedisConfig(t))
	rt.RunManager(t, rt.ManagerCase{Tier: tier, ExcludeLoad: `{"kv_load_tiers": [{"medium": "storage"}]}`})
}

// A server that restarts empty loses its blocks without a keyspace event:
// the reconciliation pass that follows the recovery publishes their
// removals, once each, and announced = present holds again. A key deleted
// while the subscriber is disconnected is reported too, by the keyspace
// event or by the pass that follows the resubscription.
func TestIntegrationReconcileAfterRestartAndResubscribe(t *testing.T) {
	p := startRedis(t)
	cfg := itConfig(p.addr)
	cfg.KeyspaceEvents = true
	cfg.ReconcileInterval = time.Hour // only the triggered passes
	tier := newTier(t, cfg)
	raw := p.client()
	ctx := context.Background()
	arena := rt.NewArena(4096, 8)
	keys := rt.Keys(0, 8)
	if res := rt.Run(t, tier, rt.StoreJob(1, arena, keys, rt.Slots(0, 8))); !res.Success {
		t.Fatal(res)
	}
	tier.TakeEvents()

	// Subscriber connection killed, a key deleted at once.
	if err := raw.Do(ctx, "CLIENT", "KILL", "TYPE", "pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	raw.Del(ctx, tier.redisKey(keys[0]))
	waitRemoved(t, tier, map[offload.Key]bool{keys[0]: true}, 15*time.Second)

	// Restart without persistence: every block is gone.
	p.Stop()
	rt.StoreUntilDown(t, tier, arena, 0, 100, 10*time.Second)
	tier.TakeEvents()
	p.Start()
	rt.Eventually(t, 10*time.Second, "healthy after restart", tier.Healthy)
	want := map[offload.Key]bool{}
	for _, k := range keys[1:] {
		want[k] = true
	}
	waitRemoved(t, tier, want, 15*time.Second)
	if st := tier.Stats(); st.ReconciledRemovals < 7 {
		t.Fatalf("reconciled removals %d, want >= 7 (stats %+v)", st.ReconciledRemovals, st)
	}
	// Nothing is announced any more, so nothing is removed twice.
	if _, removed, err := tier.Reconcile(ctx); err != nil || removed != 0 {
		t.Fatalf("second pass removed %d (%v)", removed, err)
	}
	for _, ev := range tier.TakeEvents() {
		if ev.Removed {
			t.Fatalf("removal published twice: %+v", ev)
		}
	}
}

// TestIntegrationBudget: max_bytes and tenants' quotas on a real server
// (remotetest.RunBudget).
func TestIntegrationBudget(t *testing.T) {
	base := sharedRedisConfig(t)
	runBudget(t, base, func(ctx context.Context, fn func(*goredis.Client) error) error {
		c := goredis.NewClient(&goredis.Options{Addr: base.Addr})
		defer c.Close()
		return fn(c)
	})
}

// TestIntegrationClusterBudget: the same on a Redis Cluster, whose
// blocks the tier lists and deletes on every master.
func TestIntegrationClusterBudget(t *testing.T) {
	addrs := clusterAddrs(t)
	raw := rawCluster(t, addrs)
	base := clusterConfig(addrs)
	eachMaster := func(ctx context.Context, fn func(*goredis.Client) error) error {
		return raw.ForEachMaster(ctx, func(ctx context.Context, c *goredis.Client) error { return fn(c) })
	}
	t.Cleanup(func() {
		eachMaster(context.Background(), func(c *goredis.Client) error {
			for _, n := range c.Keys(context.Background(), base.KeyPrefix+"*").Val() {
				c.Del(context.Background(), n)
			}
			return nil
		})
	})
	runBudget(t, base, eachMaster)
}

// runBudget runs remotetest.RunBudget on tiers of base, listing the
// server's keys with eachServer (every master of a cluster).
func runBudget(t *testing.T, base Config, eachServer func(context.Context, func(*goredis.Client) error) error) {
	rt.RunBudget(t, rt.BudgetCase{
		New: func(ctx context.Context, maxBytes int64, shares []quota.Share) (offload.SecondaryTier, error) {
			cfg := base
			cfg.MaxBytes, cfg.Shares = confvalue.ByteSize(maxBytes), shares
			return New(ctx, cfg)
		},
		Held: func(t testing.TB) []offload.Key {
			var mu sync.Mutex
			var out []offload.Key
			parse := &Tier{cfg: base}
			err := eachServer(context.Background(), func(c *goredis.Client) error {
				names, err := c.Keys(context.Background(), base.KeyPrefix+"*").Result()
				mu.Lock()
				defer mu.Unlock()
				for _, n := range names {
					if k, ok := parse.parseKey(n); ok {
						out = append(out, k)
					}
				}
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			return out
		},
	})
}
