package redis

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/kvtier/kvtier/offload"
	rt "github.com/kvtier/kvtier/tiers/remote/remotetest"
)

// A Redis Cluster for the tests: the shared one the test script starts
// (KVTIER_TEST_REDIS_CLUSTER_ADDRS, comma-separated seeds), or one of the
// test's own: three masters and three replicas from redis-server on PATH,
// created with redis-cli --cluster create.

type redisCluster struct {
	nodes []*redisServer
	addrs []string
}

// startCluster starts a cluster of three masters and three replicas, each
// node with the extra redis-server arguments.
func startCluster(t testing.TB, extra ...string) *redisCluster {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		rt.RequireIntegration(t, "redis-server on PATH")
	}
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		rt.RequireIntegration(t, "redis-cli on PATH")
	}
	c := &redisCluster{}
	for range 6 {
		p := &redisServer{t: t, addr: rt.FreeAddr(t)}
		host, port, _ := net.SplitHostPort(p.addr)
		_, bus, _ := net.SplitHostPort(rt.FreeAddr(t))
		args := []string{bin, "--port", port, "--bind", host, "--save", "", "--appendonly", "no", "--dir", t.TempDir(),
			"--cluster-enabled", "yes", "--cluster-port", bus, "--cluster-node-timeout", "1500",
			// Promote a replica however long since it heard from its master
			// (an idle test cluster otherwise refuses to fail over).
			"--cluster-replica-validity-factor", "0",
			"--cluster-config-file", "nodes.conf"}
		args = append(args, extra...)
		p.Process = rt.StartProcess(t, "redis-server", args, func() error {
			c := goredis.NewClient(&goredis.Options{Addr: p.addr, MaxRetries: -1})
			defer c.Close()
			return c.Ping(context.Background()).Err()
		}, 10*time.Second)
		c.nodes = append(c.nodes, p)
		c.addrs = append(c.addrs, p.addr)
	}
	out, err := exec.Command(cli, append(append([]string{"--cluster", "create"}, c.addrs...), "--cluster-replicas", "1", "--cluster-yes")...).CombinedOutput()
	if err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	c.waitOK(t, 20*time.Second)
	return c
}

// waitOK waits until every running node reports cluster_state:ok.
func (c *redisCluster) waitOK(t testing.TB, timeout time.Duration) {
	t.Helper()
	rt.Eventually(t, timeout, "cluster_state:ok on every node", func() bool {
		for _, n := range c.nodes {
			if n.Process == nil {
				continue
			}
			cl := goredis.NewClient(&goredis.Options{Addr: n.addr, MaxRetries: -1})
			info, err := cl.ClusterInfo(context.Background()).Result()
			cl.Close()
			if err != nil {
				if strings.Contains(err.Error(), "connection refused") {
					continue // a node the test stopped
				}
				return false
			}
			if !strings.Contains(info, "cluster_state:ok") {
				return false
			}
		}
		return true
	})
}

// clusterAddrs returns the seeds of the shared cluster, or of a cluster of
// the test's own.
func clusterAddrs(t testing.TB) []string {
	if s := os.Getenv("KVTIER_TEST_REDIS_CLUSTER_ADDRS"); s != "" {
		return strings.Split(s, ",")
	}
	return startCluster(t).addrs
}

func clusterConfig(addrs []string) Config {
	cfg := itConfig("")
	cfg.Addr = ""
	cfg.Cluster = true
	cfg.Addrs = addrs
	cfg.ProbeInterval = 100 * time.Millisecond
	return cfg
}

func rawCluster(t testing.TB, addrs []string) *goredis.ClusterClient {
	c := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { c.Close() })
	return c
}

// mastersOf returns the master address of each key.
func mastersOf(t testing.TB, raw *goredis.ClusterClient, tier *Tier, keys []offload.Key) map[string][]offload.Key {
	t.Helper()
	out := map[string][]offload.Key{}
	for _, k := range keys {
		c, err := raw.MasterForKey(context.Background(), tier.redisKey(k))
		if err != nil {
			t.Fatal(err)
		}
		out[c.Options().Addr] = append(out[c.Options().Addr], k)
	}
	return out
}

func TestIntegrationClusterRoundTrip2MiB(t *testing.T) {
	addrs := clusterAddrs(t)
	cfg := clusterConfig(addrs)
	tier := newTier(t, cfg)
	raw := rawCluster(t, addrs)
	keys := rt.Keys(0, 16)
	if by := mastersOf(t, raw, tier, keys); len(by) < 3 {
		t.Fatalf("16 keys on %d masters, want all 3 (slot spread)", len(by))
	}
	// Two store jobs of 8 blocks: each pipeline spans several nodes.
	roundTrip(t, tier, keys, 2<<20, 8)
	if nodes := tier.Nodes(); len(nodes) != 3 {
		t.Fatalf("nodes %+v, want 3 healthy masters", nodes)
	}
}

// Keyspace notifications are local to each node: removals from every
// master reach the tier's events.
func TestIntegrationClusterKeyspaceRemovals(t *testing.T) {
	addrs := clusterAddrs(t)
	cfg := clusterConfig(addrs)
	cfg.KeyspaceEvents = true
	tier := newTier(t, cfg)
	if !tier.Stats().KeyspaceEvents {
		t.Fatal("keyspace events not enabled on the cluster")
	}
	raw := rawCluster(t, addrs)
	arena := rt.NewArena(1024, 24)
	keys := rt.Keys(100, 24)
	if res := rt.Run(t, tier, rt.StoreJob(1, arena, keys, rt.Slots(0, 24))); !res.Success {
		t.Fatal(res)
	}
	by := mastersOf(t, raw, tier, keys)
	if len(by) < 3 {
		t.Fatalf("keys on %d masters", len(by))
	}
	tier.TakeEvents()
	want := map[offload.Key]bool{}
	for _, ks := range by {
		raw.Del(context.Background(), tier.redisKey(ks[0]))
		want[ks[0]] = true
	}
	waitRemoved(t, tier, want, 10*time.Second)
}

// Killing a master mid-run: its replica takes over; every job is answered
// once, no load ever returns wrong bytes, the tier is healthy again and
// follows the new master's keyspace events.
func TestIntegrationClusterFailover(t *testing.T) {
	c := startCluster(t)
	cfg := clusterConfig(c.addrs)
	cfg.KeyspaceEvents = true
	cfg.Retries = 1
	tier := newTier(t, cfg)
	raw := rawCluster(t, c.addrs)
	const slot, n = 64 << 10, 32
	src := rt.NewArena(slot, n)
	for i := range n {
		src.Fill(int64(i), uint64(1000+i))
	}
	keys := rt.Keys(500, n)
	if res := rt.Run(t, tier, rt.StoreJob(1, src, keys, rt.Slots(0, n))); !res.Success {
		t.Fatal(res)
	}
	by := mastersOf(t, raw, tier, keys)
	var victim string
	for a := range by {
		victim = a
		break
	}

	// Jobs run while the master dies and its replica is promoted.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var loads, okLoads, wrong int
	seen := map[uint64]bool{}
	wg.Go(func() {
		id := uint64(100)
		for {
			select {
			case <-stop:
				return
			default:
			}
			id++
			req, _ := offload.NewReqContext(fmt.Sprint("r", id), nil)
			dst := rt.NewArena(slot, n)
			tier.SubmitLoad(rt.LoadJob(id, dst, keys, rt.Slots(0, n), req))
			for _, r := range rt.WaitJobs(t, tier, 1, 30*time.Second) {
				mu.Lock()
				if seen[r.JobID] {
					t.Errorf("job %d answered twice", r.JobID)
				}
				seen[r.JobID] = true
				loads++
				if r.Success {
					okLoads++
				}
				// Every block a load reports loaded holds its own bytes.
				for _, k := range r.SuccessfulKeys {
					i := slices.Index(keys, k)
					a, _ := src.Slot(int64(i))
					b, _ := dst.Slot(int64(i))
					if !bytes.Equal(a, b) {
						wrong++
					}
				}
				mu.Unlock()
			}
		}
	})
	for _, nd := range c.nodes {
		if nd.addr == victim {
			nd.Stop()
			nd.Process = nil
		}
	}
	c.waitOK(t, 30*time.Second)
	defer func() {
		if t.Failed() {
			t.Logf("victim %s; healthy %v; nodes %+v", victim, tier.Healthy(), tier.Nodes())
		}
	}()
	rt.Eventually(t, 30*time.Second, "tier healthy and following the new master", func() bool {
		if !tier.Healthy() {
			return false
		}
		nodes := tier.Nodes()
		if len(nodes) != 3 {
			return false
		}
		for _, nd := range nodes {
			if nd.Addr == victim || !nd.Healthy {
				return false
			}
		}
		return true
	})
	close(stop)
	wg.Wait()
	if wrong > 0 {
		t.Fatalf("%d wrong blocks served across %d loads", wrong, loads)
	}
	// Stores and loads succeed again, with the right bytes.
	id := uint64(1 << 20)
	rt.Eventually(t, 30*time.Second, "a store and a load after the failover", func() bool {
		id += 2
		if res := rt.Run(t, tier, rt.StoreJob(id, src, keys, rt.Slots(0, n))); !res.Success {
			return false
		}
		req, _ := offload.NewReqContext(fmt.Sprint("after", id), nil)
		dst := rt.NewArena(slot, n)
		if res := rt.Run(t, tier, rt.LoadJob(id+1, dst, keys, rt.Slots(0, n), req)); !res.Success {
			return false
		}
		for i := range n {
			a, _ := src.Slot(int64(i))
			b, _ := dst.Slot(int64(i))
			if !bytes.Equal(a, b) {
				t.Fatalf("block %d differs after the failover", i)
			}
		}
		return true
	})
	// The promoted master's keyspace events reach the tier.
	tier.TakeEvents()
	k := by[victim][0]
	// A client made now knows the new slot map (the old one may still
	// send to the dead master until it notices).
	var live []string
	for _, a := range c.addrs {
		if a != victim {
			live = append(live, a)
		}
	}
	raw = rawCluster(t, live)
	if err := raw.Del(context.Background(), tier.redisKey(k)).Err(); err != nil {
		t.Fatal(err)
	}
	waitRemoved(t, tier, map[offload.Key]bool{k: true}, 10*time.Second)
	t.Logf("%d loads during the failover, %d successful", loads, okLoads)
}
