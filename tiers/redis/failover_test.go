package redis

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/tiers/redis/slotmap"
	rt "github.com/kvtier/kvtier/tiers/remote/remotetest"
)

// A master killed with SIGKILL mid-load (the acceptance test of per-node
// health): the other masters' blocks keep loading, answering lookups and
// storing throughout — no refusal, no failed load, the tier as a whole
// never down —, the dead master's keys are served from the promoted
// replica once the cluster has failed over, no load ever returns wrong
// bytes, and every block acknowledged as stored on a surviving master
// loads afterwards.
//
// The cluster is the test's own (killing a master of the suite's shared
// cluster would disturb the packages that run beside it), configured
// like the suite's, with cluster-require-full-coverage no: with the
// default, every master answers CLUSTERDOWN from the moment the cluster
// marks the dead master failed until a replica is promoted, and no
// client can serve the other masters' keys in that gap.
//
// The test measures, and logs, how long after the cluster's own failover
// (the first CLUSTER SLOTS answer of a surviving master that names the
// promoted replica) the tier loads the dead master's keys again; it does
// not assert a time. KVTIER_FAILOVER_RUNS=N repeats the kill on N fresh
// clusters (BENCHMARKS.md records the figures).
func TestIntegrationClusterMasterKilledMidLoad(t *testing.T) {
	runs := 1
	if s := os.Getenv("KVTIER_FAILOVER_RUNS"); s != "" {
		fmt.Sscan(s, &runs)
	}
	for run := range runs {
		t.Run(fmt.Sprint("run", run), func(t *testing.T) { killMasterMidLoad(t) })
	}
}

func killMasterMidLoad(t *testing.T) {
	c := startCluster(t, "--cluster-node-timeout", "2000", "--cluster-require-full-coverage", "no")
	cfg := clusterConfig(c.addrs)
	cfg.ProbeInterval = DefaultProbeInterval // the default: fast reloads while a node is down are the tier's own
	cfg.Retries = 1
	tier := newTier(t, cfg)
	raw := rawCluster(t, c.addrs)

	const slot, n = 16 << 10, 48
	src := rt.NewArena(slot, n)
	for i := range n {
		src.Fill(int64(i), uint64(7000+i))
	}
	keys := rt.Keys(900, n)
	if res := rt.Run(t, tier, rt.StoreJob(1, src, keys, rt.Slots(0, n))); !res.Success {
		t.Fatal(res)
	}
	by := mastersOf(t, raw, tier, keys)
	if len(by) != 3 {
		t.Fatalf("keys on %d masters, want 3", len(by))
	}
	victim := c.addrs[0]
	if by[victim] == nil {
		for a := range by {
			victim = a
		}
	}
	// The replica has every block of the victim before it dies.
	vc := goredis.NewClient(&goredis.Options{Addr: victim, MaxRetries: -1, ReadTimeout: 10 * time.Second})
	// (A new cluster's replicas may not have synced yet: WAIT until one
	// acknowledges.)
	rt.Eventually(t, 30*time.Second, "the victim's replica acknowledges its writes", func() bool {
		n, err := vc.Do(context.Background(), "WAIT", 1, 1000).Int()
		return err == nil && n >= 1
	})
	vc.Close()
	var survivors, victims []offload.Key
	var survivorIdx, victimIdx []int64
	for i, k := range keys {
		if slices.Contains(by[victim], k) {
			victims, victimIdx = append(victims, k), append(victimIdx, int64(i))
		} else {
			survivors, survivorIdx = append(survivors, k), append(survivorIdx, int64(i))
		}
	}
	vslot := slotOf(t, raw, tier.redisKey(victims[0]))
	// Where every key lived before the kill.
	var ranges []slotmap.Range
	//lint:ignore SA1019 the map the tier reads
	cs, err := raw.ClusterSlots(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range cs {
		ranges = append(ranges, slotmap.Range{Start: int(s.Start), End: int(s.End), Master: s.Nodes[0].Addr})
	}
	before := slotmap.New(ranges)

	var live []string
	for _, a := range c.addrs {
		if a != victim {
			live = append(live, a)
		}
	}
	liveRaw := rawCluster(t, live)

	var (
		killedAt   atomic.Pointer[time.Time]
		failoverAt atomic.Pointer[time.Time]
		servedAt   atomic.Pointer[time.Time]
		stop       = make(chan struct{})
		wg         sync.WaitGroup
		mu         sync.Mutex
		problems   []string
		wrong      int
		tierDown   atomic.Int64
	)
	fail := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		if len(problems) < 20 {
			problems = append(problems, fmt.Sprintf(format, args...))
		}
	}
	check := func(dst *rt.Arena, idx []int64, loaded []offload.Key, all []offload.Key) {
		for _, k := range loaded {
			j := slices.Index(all, k)
			a, _ := src.Slot(idx[j])
			b, _ := dst.Slot(int64(j))
			if !bytes.Equal(a, b) {
				mu.Lock()
				wrong++
				mu.Unlock()
			}
		}
	}

	// Lookups of the survivors' blocks: every check finds every one.
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			found, err := tier.exists(context.Background(), survivors)
			if err != nil {
				fail("lookup of the survivors' blocks: %v", err)
				continue
			}
			for i, f := range found {
				if !f {
					fail("lookup of survivor block %s: miss", survivors[i])
				}
			}
			if !tier.Healthy() {
				tierDown.Add(1)
			}
		}
	})

	// Rounds of three jobs: a load of the survivors' blocks (must succeed
	// every time), a load of the victim's (fails while it is down, then
	// succeeds from the promoted replica), and a store of new blocks on
	// every master (the survivors' blocks must be stored every time).
	storeSrc := rt.NewArena(slot, 12)
	for i := range 12 {
		storeSrc.Fill(int64(i), uint64(9000+i))
	}
	var acked []offload.Key // stored on a survivor, acknowledged
	var rounds, victimOK atomic.Int64
	wg.Go(func() {
		id := uint64(100)
		for r := 0; ; r++ {
			select {
			case <-stop:
				return
			default:
			}
			rounds.Add(1)
			submitted := time.Now()
			req, _ := offload.NewReqContext(fmt.Sprint("round", r), nil)
			sDst, vDst := rt.NewArena(slot, len(survivors)), rt.NewArena(slot, len(victims))
			fresh := rt.Keys(100000+12*r, 12)
			ids := [3]uint64{id + 1, id + 2, id + 3}
			id += 3
			tier.SubmitLoad(rt.LoadJob(ids[0], sDst, survivors, rt.Slots(0, len(survivors)), req))
			tier.SubmitLoad(rt.LoadJob(ids[1], vDst, victims, rt.Slots(0, len(victims)), req))
			tier.SubmitStore(rt.StoreJob(ids[2], storeSrc, fresh, rt.Slots(0, 12)))
			for _, res := range rt.WaitJobs(t, tier, 3, 60*time.Second) {
				switch res.JobID {
				case ids[0]:
					if !res.Success {
						fail("round %d: load of the survivors' blocks failed: %v", r, res.Err)
					}
					loaded := survivors
					if !res.Success {
						loaded = res.SuccessfulKeys
					}
					check(sDst, survivorIdx, loaded, survivors)
				case ids[1]:
					loaded := victims
					if !res.Success {
						loaded = res.SuccessfulKeys
					}
					check(vDst, victimIdx, loaded, victims)
					// A load sent once the victim was dead succeeded: from
					// the promoted replica.
					if k := killedAt.Load(); res.Success && k != nil && submitted.After(*k) {
						if victimOK.Add(1) == 1 {
							now := time.Now()
							servedAt.Store(&now)
						}
					}
				case ids[2]:
					if _, refused := offload.RefusalReason(res.Err); refused {
						fail("round %d: store refused as a whole: %v", r, res.Err)
					}
					// Whatever became of the victim's part, the survivors'
					// blocks are on their masters.
					for _, k := range fresh {
						node := before.Master(tier.redisKey(k))
						if node == victim {
							continue
						}
						if n, err := liveRaw.Exists(context.Background(), tier.redisKey(k)).Result(); err != nil || n != 1 {
							fail("round %d: survivor block %s (on %s) not stored: %v", r, k, node, err)
						} else if res.Success {
							mu.Lock()
							acked = append(acked, k)
							mu.Unlock()
						}
					}
				}
			}
		}
	})

	// The cluster's failover, as a client of a surviving master sees it.
	wg.Go(func() {
		cl := goredis.NewClient(&goredis.Options{Addr: live[0], MaxRetries: -1, ReadTimeout: time.Second})
		defer cl.Close()
		for failoverAt.Load() == nil {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			if killedAt.Load() == nil {
				continue
			}
			//lint:ignore SA1019 the map the tier reads
			slots, err := cl.ClusterSlots(context.Background()).Result()
			if err != nil {
				continue
			}
			for _, s := range slots {
				if int(s.Start) <= vslot && vslot <= int(s.End) && len(s.Nodes) > 0 && s.Nodes[0].Addr != victim {
					now := time.Now()
					failoverAt.Store(&now)
				}
			}
		}
	})

	// Let some rounds run, then kill the victim.
	rt.Eventually(t, 30*time.Second, "rounds before the kill", func() bool { return rounds.Load() >= 3 })
	for _, nd := range c.nodes {
		if nd.addr == victim {
			nd.Stop() // SIGKILL, and wait until it has exited
			nd.Process = nil
			now := time.Now()
			killedAt.Store(&now)
		}
	}
	rt.Eventually(t, 60*time.Second, "the victim's blocks served again, 5 times", func() bool {
		return failoverAt.Load() != nil && victimOK.Load() >= 5
	})
	close(stop)
	wg.Wait()

	for _, p := range problems {
		t.Error(p)
	}
	if wrong > 0 {
		t.Fatalf("%d wrong blocks served", wrong)
	}
	if n := tierDown.Load(); n > 0 {
		t.Errorf("the tier as a whole was down in %d lookups", n)
	}
	// Every block acknowledged on a survivor, and every block stored
	// before the kill, loads with its bytes.
	req, _ := offload.NewReqContext("after", nil)
	dst := rt.NewArena(slot, n)
	if res := rt.Run(t, tier, rt.LoadJob(1<<30, dst, keys, rt.Slots(0, n), req)); !res.Success {
		t.Fatalf("load of every block after the failover: %v", res.Err)
	}
	for i := range n {
		a, _ := src.Slot(int64(i))
		b, _ := dst.Slot(int64(i))
		if !bytes.Equal(a, b) {
			t.Fatalf("block %d differs after the failover", i)
		}
	}
	if len(acked) > 0 {
		dst := rt.NewArena(slot, len(acked))
		if res := rt.Run(t, tier, rt.LoadJob(1<<30+1, dst, acked, rt.Slots(0, len(acked)), req)); !res.Success {
			t.Fatalf("load of %d acknowledged survivor blocks: %v", len(acked), res.Err)
		}
	}
	for _, nd := range tier.Nodes() {
		if nd.Addr == victim || !nd.Healthy {
			t.Fatalf("nodes after the failover: %+v", tier.Nodes())
		}
	}
	k, f, s := *killedAt.Load(), *failoverAt.Load(), *servedAt.Load()
	st := tier.Stats()
	t.Logf("failover: cluster promoted a replica %v after the kill; the tier served the victim's blocks %v after the kill, %v after the cluster's failover; %d rounds, %d acknowledged survivor blocks, %d blocks refused or missed on the dead node, %d slot map changes",
		f.Sub(k).Round(time.Millisecond), s.Sub(k).Round(time.Millisecond), s.Sub(f).Round(time.Millisecond),
		rounds.Load(), len(acked), st.BlocksNodeDown, tier.SlotMapReloads())
}

// slotOf asks the cluster for key's slot.
func slotOf(t testing.TB, raw *goredis.ClusterClient, key string) int {
	t.Helper()
	s, err := raw.ClusterKeySlot(context.Background(), key).Result()
	if err != nil {
		t.Fatal(err)
	}
	return int(s)
}

// masterOf returns the master of k as the client raw knows it ("" when it
// knows none).
func masterOf(t testing.TB, raw *goredis.ClusterClient, tier *Tier, k offload.Key) string {
	c, err := raw.MasterForKey(context.Background(), tier.redisKey(k))
	if err != nil {
		return ""
	}
	return c.Options().Addr
}

// The tier's key slots are the cluster's.
func TestIntegrationClusterKeySlots(t *testing.T) {
	addrs := clusterAddrs(t)
	tier := newTier(t, clusterConfig(addrs))
	raw := rawCluster(t, addrs)
	for _, k := range rt.Keys(0, 200) {
		key := tier.redisKey(k)
		if got, want := slotmap.Slot(key), slotOf(t, raw, key); got != want {
			t.Fatalf("slot of %q: %d, the cluster says %d", key, got, want)
		}
		if n := tier.route(key); n == nil || n.addr != masterOf(t, raw, tier, k) {
			t.Fatalf("route of %q: %v, the cluster's master is %s", key, n, masterOf(t, raw, tier, k))
		}
	}
}
