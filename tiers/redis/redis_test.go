package redis

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/tiers/remote"
	rt "github.com/kvtier/kvtier/tiers/remote/remotetest"
)

func testConfig(addr string) Config {
	cfg := DefaultConfig()
	cfg.Name = "dram"
	cfg.Addr = addr
	cfg.KeyPrefix = "ns1:"
	cfg.Locality = "remote"
	cfg.PoolSize = 4
	cfg.Timeout = time.Second
	cfg.DialTimeout = 500 * time.Millisecond
	cfg.RetryBackoff = time.Millisecond
	cfg.ProbeInterval = 20 * time.Millisecond
	cfg.Events = true
	cfg.Logger = slog.New(slog.DiscardHandler)
	return cfg
}

func newTier(t *testing.T, cfg Config) *Tier {
	t.Helper()
	return rt.NewTier(t, New, cfg)
}

func TestConfigValidation(t *testing.T) {
	base := testConfig("127.0.0.1:6379")
	cases := []rt.ConfigCase[Config]{
		{Name: "ok", Mod: func(*Config) {}},
		{Name: "no addr", Mod: func(c *Config) { c.Addr = "" }, Key: "addr"},
		{Name: "addr without port", Mod: func(c *Config) { c.Addr = "localhost" }, Key: "addr"},
		{Name: "negative db", Mod: func(c *Config) { c.DB = -1 }, Key: "db"},
		{Name: "cluster seeds", Mod: func(c *Config) { c.Cluster, c.Addr, c.Addrs = true, "", []string{"h:1", "h:2"} }},
		{Name: "cluster addr as seed", Mod: func(c *Config) { c.Cluster = true }},
		{Name: "cluster without seeds", Mod: func(c *Config) { c.Cluster, c.Addr = true, "" }, Key: "addrs"},
		{Name: "cluster bad seed", Mod: func(c *Config) { c.Cluster, c.Addr, c.Addrs = true, "", []string{"h:1", "h"} }, Key: "addrs[1]"},
		{Name: "addrs without cluster", Mod: func(c *Config) { c.Addrs = []string{"h:1"} }, Key: "addrs"},
		{Name: "cluster db", Mod: func(c *Config) { c.Cluster, c.DB = true, 1 }, Key: "db"},
		{Name: "prefix with space", Mod: func(c *Config) { c.KeyPrefix = "a b" }, Key: "key_prefix"},
		{Name: "negative ttl", Mod: func(c *Config) { c.TTL = -time.Second }, Key: "ttl"},
		{Name: "sub-millisecond ttl", Mod: func(c *Config) { c.TTL = time.Microsecond }, Key: "ttl"},
		{Name: "negative max value", Mod: func(c *Config) { c.MaxValueBytes = -1 }, Key: "max_value_bytes"},
		{Name: "bad locality", Mod: func(c *Config) { c.Locality = "far" }, Key: "locality"},
		{Name: "local ok", Mod: func(c *Config) { c.Locality = "Local" }},
		{Name: "negative pool", Mod: func(c *Config) { c.PoolSize = -1 }, Key: "pool_size"},
		{Name: "negative inflight", Mod: func(c *Config) { c.MaxInflight = -1 }, Key: "max_inflight"},
		{Name: "negative retries", Mod: func(c *Config) { c.Retries = -1 }, Key: "retries"},
		{Name: "negative timeout", Mod: func(c *Config) { c.Timeout = -1 }, Key: "timeout"},
		{Name: "negative dial timeout", Mod: func(c *Config) { c.DialTimeout = -1 }, Key: "dial_timeout"},
		{Name: "negative probe interval", Mod: func(c *Config) { c.ProbeInterval = -1 }, Key: "probe_interval"},
		{Name: "negative lookup batch", Mod: func(c *Config) { c.LookupBatch = -5 }, Key: "lookup_batch"},
	}
	rt.CheckConfig(t, base, func(c Config) error { return c.withDefaults().Validate() }, cases)
}

func TestStartupErrors(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	_, err = New(context.Background(), testConfig(addr))
	if !errors.Is(err, ErrUnreachable) || !strings.Contains(err.Error(), addr) {
		t.Fatalf("got %v, want ErrUnreachable naming %s", err, addr)
	}

	m := miniredis.RunT(t)
	m.RequireAuth("secret")
	_, err = New(context.Background(), testConfig(m.Addr()))
	if err == nil || errors.Is(err, ErrUnreachable) {
		t.Fatalf("wrong password: got %v", err)
	}
	cfg := testConfig(m.Addr())
	cfg.Password = "secret"
	newTier(t, cfg)
}

func TestKeyNames(t *testing.T) {
	tier := &Tier{cfg: Config{KeyPrefix: "p:x:"}}
	k := offload.MakeKey([]byte{0xde, 0xad, 0xbe, 0xef}, 3)
	s := tier.redisKey(k)
	if s != "p:x:deadbeef:3" {
		t.Fatalf("key %q", s)
	}
	if got, ok := tier.parseKey(s); !ok || got != k {
		t.Fatalf("parse %q: %v %v", s, got, ok)
	}
	for _, bad := range []string{"other:deadbeef:3", "p:x:zz:1", "p:x:deadbeef:", "p:x::1", "p:x:deadbeef:99999999999", "p:x:"} {
		if _, ok := tier.parseKey(bad); ok {
			t.Errorf("parsed foreign key %q", bad)
		}
	}
	if !strings.Contains(missingFlags(""), "E") || missingFlags("KEA") != "" || missingFlags("Egx") != "e" || missingFlags("Kgxe") != "E" {
		t.Fatal("missingFlags")
	}
}

func TestStoreLookupLoadRoundTrip(t *testing.T) {
	m := miniredis.RunT(t)
	cfg := testConfig(m.Addr())
	cfg.TTL = time.Hour
	tier := newTier(t, cfg)
	if tier.Type() != "redis" || tier.Medium() != offload.MediumCPU || tier.Locality() != offload.LocalityRemote || tier.Name() != "dram" {
		t.Fatal("declarations")
	}
	const slot = 32<<10 + 5
	src := rt.NewArena(slot, 3)
	for i := 0; i < 3; i++ {
		src.Fill(int64(i), uint64(i+7))
	}
	keys := rt.Keys(0, 3)
	req, _ := offload.NewReqContext("req", nil)
	if r := tier.Lookup(keys[0], req); r != offload.Retry {
		t.Fatalf("first lookup %v", r)
	}
	if r := rt.Resolve(t, tier, keys[0], req); r != offload.Miss {
		t.Fatalf("before store %v", r)
	}
	res := rt.Run(t, tier, rt.StoreJob(1, src, keys, rt.Slots(0, 3)))
	if !res.Success || res.Bytes != 3*slot {
		t.Fatalf("store %+v", res)
	}
	evs := tier.TakeEvents()
	if len(evs) != 1 || evs[0].Removed || evs[0].Medium != offload.MediumCPU || evs[0].Locality != offload.LocalityRemote || evs[0].Tier != "dram" || len(evs[0].Keys) != 3 {
		t.Fatalf("events %+v", evs)
	}
	rk := tier.redisKey(keys[1])
	if ttl := m.TTL(rk); ttl != time.Hour {
		t.Fatalf("ttl of %s: %v", rk, ttl)
	}
	v, err := m.Get(rk)
	if err != nil || len(v) != slot+remote.HeaderSize {
		t.Fatalf("stored value: %d bytes, %v", len(v), err)
	}

	req2, _ := offload.NewReqContext("req2", nil)
	for _, k := range keys {
		if r := rt.Resolve(t, tier, k, req2); r != offload.Hit {
			t.Fatalf("lookup %s: %v", k, r)
		}
	}
	dst := rt.NewArena(slot, 3)
	res = rt.Run(t, tier, rt.LoadJob(2, dst, keys, []int64{2, 1, 0}, req2))
	if !res.Success || res.Bytes != 3*slot {
		t.Fatalf("load %+v", res)
	}
	for i, d := range []int64{2, 1, 0} {
		a, _ := src.Slot(int64(i))
		b, _ := dst.Slot(d)
		if !bytes.Equal(a, b) {
			t.Fatalf("block %d differs", i)
		}
	}
	st := tier.Stats()
	if st.BlocksStored != 3 || st.BlocksLoaded != 3 || st.StoreJobsOK != 1 || st.LoadJobsOK != 1 || !st.Healthy || st.BytesWritten != 3*slot {
		t.Fatalf("stats %+v", st)
	}

	// Touch refreshes the TTL in the background.
	m.FastForward(50 * time.Minute)
	tier.Touch(keys[:1], req2)
	rt.Eventually(t, 5*time.Second, "ttl refreshed", func() bool { return m.TTL(tier.redisKey(keys[0])) == time.Hour })

	tier.OnRequestFinished(req)
	tier.OnRequestFinished(req2)
	rt.Drain(t, tier)
	if tier.HasPendingWork() {
		t.Fatal("pending work when idle")
	}
}

func TestMaxValueBytes(t *testing.T) {
	m := miniredis.RunT(t)
	cfg := testConfig(m.Addr())
	cfg.MaxValueBytes = 1024
	tier := newTier(t, cfg)
	res := rt.Run(t, tier, rt.StoreJob(1, rt.NewArena(1024, 1), rt.Keys(0, 1), []int64{0}))
	if res.Success || !errors.Is(res.Err, ErrValueTooLarge) || !strings.Contains(res.Err.Error(), "max_value_bytes") {
		t.Fatalf("oversized store %+v", res)
	}
	if res := rt.Run(t, tier, rt.StoreJob(2, rt.NewArena(1024-remote.HeaderSize, 1), rt.Keys(0, 1), []int64{0})); !res.Success {
		t.Fatalf("store at the limit %+v", res)
	}
	if len(m.Keys()) != 1 {
		t.Fatalf("keys %v", m.Keys())
	}
}

// storeTwo stores two distinct blocks of slot bytes and returns them and
// their keys.
func storeTwo(t *testing.T, tier *Tier, slot int) (*rt.Arena, []offload.Key) {
	t.Helper()
	src := rt.NewArena(slot, 2)
	src.Fill(0, 1)
	src.Fill(1, 2)
	keys := rt.Keys(0, 2)
	if res := rt.Run(t, tier, rt.StoreJob(1, src, keys, rt.Slots(0, 2))); !res.Success {
		t.Fatal(res)
	}
	return src, keys
}

func TestCorruptValueIsMissDeletedCounted(t *testing.T) {
	const slot = 2048
	cases := []struct {
		name    string
		corrupt func(good, other string) string
	}{
		{"flipped payload bit", func(g, _ string) string { b := []byte(g); b[remote.HeaderSize+9] ^= 0x80; return string(b) }},
		{"truncated", func(g, _ string) string { return g[:len(g)-1] }},
		{"shorter than header", func(g, _ string) string { return g[:7] }},
		{"empty", func(string, string) string { return "" }},
		{"trailing bytes", func(g, _ string) string { return g + "xyz" }},
		{"bad version", func(g, _ string) string { b := []byte(g); b[4] = 9; return string(b) }},
		{"another key's value", func(_, o string) string { return o }},
		{"bad checksum field", func(g, _ string) string { b := []byte(g); b[20] ^= 1; return string(b) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := miniredis.RunT(t)
			tier := newTier(t, testConfig(m.Addr()))
			_, keys := storeTwo(t, tier, slot)
			tier.TakeEvents()
			good, _ := m.Get(tier.redisKey(keys[0]))
			other, _ := m.Get(tier.redisKey(keys[1]))
			m.Set(tier.redisKey(keys[0]), tc.corrupt(good, other))

			req, _ := offload.NewReqContext("r", nil)
			if r := rt.Resolve(t, tier, keys[0], req); r != offload.Hit {
				t.Fatalf("lookup %v", r)
			}
			dst := rt.NewArena(slot, 2)
			res := rt.Run(t, tier, rt.LoadJob(2, dst, keys, rt.Slots(0, 2), req))
			// The corrupt block fails alone (issue 11): the other loads.
			if res.Success || !errors.Is(res.Err, remote.ErrCorrupt) || len(res.SuccessfulKeys) != 1 || res.SuccessfulKeys[0] != keys[1] {
				t.Fatalf("load %+v", res)
			}
			// The slot of the failed block may hold what was read into
			// it: the primary never exposes the slot of a failed load.
			if r := tier.Lookup(keys[0], req); r != offload.Miss {
				t.Fatalf("lookup after failed load %v", r)
			}
			if m.Exists(tier.redisKey(keys[0])) {
				t.Fatal("corrupt value not deleted")
			}
			if !m.Exists(tier.redisKey(keys[1])) {
				t.Fatal("good value deleted")
			}
			st := tier.Stats()
			if st.Corrupted != 1 || st.Deleted != 1 || st.LoadJobsFailed != 1 {
				t.Fatalf("stats %+v", st)
			}
			evs := tier.TakeEvents()
			if len(evs) != 1 || !evs[0].Removed || len(evs[0].Keys) != 1 || evs[0].Keys[0] != keys[0] {
				t.Fatalf("events %+v", evs)
			}
		})
	}
}

// A value over max_value_bytes under a block's key is read past, not
// buffered: the block is a miss counted as a size mismatch, and the
// connection goes on with the next block.
func TestOversizedValueIsMiss(t *testing.T) {
	const slot = 2048
	m := miniredis.RunT(t)
	cfg := testConfig(m.Addr())
	cfg.MaxValueBytes = remote.HeaderSize + slot
	tier := newTier(t, cfg)
	src, keys := storeTwo(t, tier, slot)
	good, _ := m.Get(tier.redisKey(keys[0]))
	m.Set(tier.redisKey(keys[0]), good+"more")
	req, _ := offload.NewReqContext("r", nil)
	dst := rt.NewArena(slot, 2)
	res := rt.Run(t, tier, rt.LoadJob(2, dst, keys, rt.Slots(0, 2), req))
	if res.Success || !errors.Is(res.Err, remote.ErrSizeMismatch) || len(res.SuccessfulKeys) != 1 || res.SuccessfulKeys[0] != keys[1] {
		t.Fatalf("load %+v", res)
	}
	a, _ := src.Slot(1)
	b, _ := dst.Slot(1)
	if !bytes.Equal(a, b) {
		t.Fatal("the block after the oversized value read back other bytes")
	}
	if st := tier.Stats(); st.SizeMismatch != 1 || st.Retries != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestCorruptDeleteKeepsRewrittenValue(t *testing.T) {
	m := miniredis.RunT(t)
	tier := newTier(t, testConfig(m.Addr()))
	k := rt.Key(1)
	m.Set(tier.redisKey(k), "good value written after the read")
	tier.deleteCorrupt(context.Background(), k, "the corrupt value that was read")
	if !m.Exists(tier.redisKey(k)) {
		t.Fatal("a value written since the read was deleted")
	}
	if st := tier.Stats(); st.Deleted != 0 {
		t.Fatalf("stats %+v", st)
	}
	tier.deleteCorrupt(context.Background(), k, "good value written after the read")
	if m.Exists(tier.redisKey(k)) {
		t.Fatal("unchanged corrupt value kept")
	}
}

func TestLoadPartialPrefixVanishedAndSizeMismatch(t *testing.T) {
	m := miniredis.RunT(t)
	tier := newTier(t, testConfig(m.Addr()))
	src := rt.NewArena(512, 3)
	keys := rt.Keys(5, 3)
	if res := rt.Run(t, tier, rt.StoreJob(1, src, keys, rt.Slots(0, 3))); !res.Success {
		t.Fatal(res)
	}
	req, _ := offload.NewReqContext("r", nil)
	for _, k := range keys {
		if r := rt.Resolve(t, tier, k, req); r != offload.Hit {
			t.Fatal(r)
		}
	}
	// The block vanished between the lookup and the load (evicted).
	m.Del(tier.redisKey(keys[1]))
	res := rt.Run(t, tier, rt.LoadJob(2, rt.NewArena(512, 3), keys, rt.Slots(0, 3), req))
	if res.Success || !errors.Is(res.Err, ErrNotFound) || !slices.Equal(res.SuccessfulKeys, []offload.Key{keys[0], keys[2]}) || res.Bytes != 1024 {
		t.Fatalf("load %+v", res)
	}
	if r := tier.Lookup(keys[1], req); r != offload.Miss {
		t.Fatalf("vanished key lookup %v", r)
	}
	res = rt.Run(t, tier, rt.LoadJob(3, rt.NewArena(256, 1), keys[:1], []int64{0}, req))
	if !errors.Is(res.Err, remote.ErrSizeMismatch) {
		t.Fatalf("size mismatch %+v", res)
	}
	if !m.Exists(tier.redisKey(keys[0])) || tier.Stats().SizeMismatch != 1 {
		t.Fatal("intact block of another size deleted or not counted")
	}
}

func TestServerDownMissFastAndRecovers(t *testing.T) {
	m := miniredis.RunT(t)
	cfg := testConfig(m.Addr())
	cfg.Retries = 1
	tier := newTier(t, cfg)
	rt.RunServerDown(t, rt.ServerDown{
		Tier:  tier,
		Stats: func() remote.Stats { return tier.Stats().Stats },
		Stop:  m.Close,
		Restart: func() { // miniredis keeps its data across Restart
			if err := m.Restart(); err != nil {
				t.Fatal(err)
			}
		},
	})
}

func TestCloseAnswersEveryJobOnce(t *testing.T) {
	m := miniredis.RunT(t)
	tier, err := New(context.Background(), testConfig(m.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	// Loads get their own arena: the manager never loads into a slot a
	// store reads, and the test must not either (a data race).
	arena, dst := rt.NewArena(64<<10, 8), rt.NewArena(64<<10, 8)
	const n = 40
	for i := 0; i < n; i++ {
		slots := []int64{int64(i % 8), int64((i + 1) % 8)}
		if i%2 == 1 {
			tier.SubmitLoad(rt.LoadJob(uint64(i), dst, rt.Keys(i, 2), slots, offload.Background("r")))
		} else {
			tier.SubmitStore(rt.StoreJob(uint64(i), arena, rt.Keys(i, 2), slots))
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := tier.Close(ctx); err != nil {
		t.Fatal(err)
	}
	rt.WaitJobs(t, tier, n, time.Second) // fails on duplicates
	if extra := tier.FinishedJobs(); len(extra) != 0 {
		t.Fatalf("extra results %+v", extra)
	}
	tier.SubmitLoad(rt.LoadJob(99, arena, rt.Keys(0, 1), []int64{0}, offload.Background("r")))
	if r := rt.WaitJobs(t, tier, 1, 10*time.Second)[0]; !errors.Is(r.Err, remote.ErrClosed) {
		t.Fatalf("after close %+v", r)
	}
}

func TestKeyspaceEventsUnsupportedIsNotFatal(t *testing.T) {
	m := miniredis.RunT(t) // no CONFIG command, no notifications
	cfg := testConfig(m.Addr())
	cfg.KeyspaceEvents = true
	tier := newTier(t, cfg)
	if tier.Stats().KeyspaceEvents {
		t.Fatal("keyspace events reported on without server support")
	}
	if res := rt.Run(t, tier, rt.StoreJob(1, rt.NewArena(128, 1), rt.Keys(0, 1), []int64{0})); !res.Success {
		t.Fatal(res)
	}
}

func TestThroughManager(t *testing.T) {
	m := miniredis.RunT(t)
	rt.RunManager(t, rt.ManagerCase{
		Tier:        newTier(t, testConfig(m.Addr())),
		ExcludeLoad: `{"kv_load_tiers": [{"locality": "local"}]}`,
	})
}

// A router's delete removes the blocks from the server (tiering.Deleter).
func TestDeleteThroughManager(t *testing.T) {
	m := miniredis.RunT(t)
	rt.RunManagerDelete(t, rt.ManagerCase{Tier: newTier(t, testConfig(m.Addr()))})
}

func TestThroughManagerOutage(t *testing.T) {
	m := miniredis.RunT(t)
	tier := newTier(t, testConfig(m.Addr()))
	rt.RunManagerOutage(t, rt.ManagerCase{Tier: tier}, rt.Outage{
		Stop:    m.Close,
		Start:   func() { m.Restart() },
		Healthy: tier.Healthy,
	})
}
