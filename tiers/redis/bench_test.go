package redis

import (
	"context"
	"log/slog"
	"os"
	"strconv"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/kvtier/kvtier/confvalue"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/tiers/remote"
	rt "github.com/kvtier/kvtier/tiers/remote/remotetest"
)

// Throughput with 2 MiB blocks through the tier against the bare go-redis
// client doing the same SET/GET loop (one pipeline per job) on the same
// server in the same run. The server is $KVTIER_TEST_REDIS_ADDR when set,
// else a redis-server the benchmark starts. Keys cycle through a small
// ring so that memory stays bounded.
//
//	go test -run '^$' -bench Throughput -benchtime=40x ./tiers/redis/

const benchBlock = 2 << 20

func BenchmarkThroughput(b *testing.B) {
	cfg := benchConfig(b)
	addr := cfg.Addr
	tier, err := New(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer tier.Close(context.Background())
	bare := goredis.NewClient(&goredis.Options{Addr: addr, PoolSize: cfg.PoolSize})
	defer bare.Close()
	for _, width := range []int{1, 8} {
		throughput(b, tier, bare, cfg.KeyPrefix, width)
	}
}

// throughput runs the four loops — the tier's store and load jobs of width
// blocks, the bare client's pipeline of SET and of GET — as sub-benchmarks
// suffixed _x<width>.
func throughput(b *testing.B, tier *Tier, bare goredis.UniversalClient, prefix string, width int) {
	ctx := context.Background()
	arena := rt.NewArena(benchBlock, width)
	for i := 0; i < width; i++ {
		arena.Fill(int64(i), uint64(i))
	}
	keys := rt.Keys(0, width)
	bareKey := func(j int) string { return prefix + "bare:" + strconv.Itoa(j) }
	suffix := "_x" + strconv.Itoa(width)
	b.Cleanup(func() {
		for j := range width {
			bare.Del(ctx, bareKey(j), tier.redisKey(keys[j]))
		}
	})
	b.Run("tier_set"+suffix, func(b *testing.B) {
		b.SetBytes(int64(width * benchBlock))
		for i := 0; i < b.N; i++ {
			if res := rt.Run(b, tier, &offload.Job{ID: uint64(i), Keys: keys, Slots: rt.Slots(0, width), Arena: arena, Req: offload.Background("b")}); !res.Success {
				b.Fatal(res.Err)
			}
		}
	})
	b.Run("bare_set"+suffix, func(b *testing.B) {
		b.SetBytes(int64(width * benchBlock))
		for i := 0; i < b.N; i++ {
			pipe := bare.Pipeline()
			for j := 0; j < width; j++ {
				slot, _ := arena.Slot(int64(j))
				pipe.Set(ctx, bareKey(j), slot, 0)
			}
			if _, err := pipe.Exec(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	// The bare pipeline plus the checksum a verified store computes (the
	// envelope's XXH3 of each block): the floor of any store that checks
	// what it reads back, on a machine whose cores the servers share.
	b.Run("bare_set_hashed"+suffix, func(b *testing.B) {
		b.SetBytes(int64(width * benchBlock))
		var hdr [remote.HeaderSize]byte
		for i := 0; i < b.N; i++ {
			pipe := bare.Pipeline()
			for j := 0; j < width; j++ {
				slot, _ := arena.Slot(int64(j))
				remote.PutHeader(hdr[:], keys[j], slot)
				pipe.Set(ctx, bareKey(j), slot, 0)
			}
			if _, err := pipe.Exec(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	dst := rt.NewArena(benchBlock, width)
	b.Run("tier_get"+suffix, func(b *testing.B) {
		b.SetBytes(int64(width * benchBlock))
		for i := 0; i < b.N; i++ {
			if res := rt.Run(b, tier, &offload.Job{ID: uint64(i), Keys: keys, Slots: rt.Slots(0, width), Arena: dst, Promotion: true, Req: offload.Background("b")}); !res.Success {
				b.Fatal(res.Err)
			}
		}
	})
	b.Run("bare_get"+suffix, func(b *testing.B) {
		b.SetBytes(int64(width * benchBlock))
		for i := 0; i < b.N; i++ {
			pipe := bare.Pipeline()
			cmds := make([]*goredis.StringCmd, width)
			for j := 0; j < width; j++ {
				cmds[j] = pipe.Get(ctx, bareKey(j))
			}
			if _, err := pipe.Exec(ctx); err != nil {
				b.Fatal(err)
			}
			for j, c := range cmds {
				slot, _ := dst.Slot(int64(j))
				copy(slot, c.Val())
			}
		}
	})
}

// The same against a Redis Cluster ($KVTIER_TEST_REDIS_CLUSTER_ADDRS, or a
// three-master cluster the benchmark starts): the tier's pipeline against
// go-redis' own cluster pipeline, both split per node by the client. The
// eight keys of a job spread over the masters.
//
//	go test -run '^$' -bench ClusterThroughput -benchtime=40x ./tiers/redis/
func BenchmarkClusterThroughput(b *testing.B) {
	addrs := clusterAddrs(b)
	cfg := clusterConfig(addrs)
	cfg.Name = "bench"
	cfg.Events = false
	tier, err := New(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer tier.Close(context.Background())
	bare := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: addrs, PoolSize: cfg.PoolSize})
	defer bare.Close()
	throughput(b, tier, bare, cfg.KeyPrefix, 8)
}

// The same over TLS: a redis-server serving only TLS (the benchmark
// starts one), the tier with tls: against go-redis with the same
// tls.Config. Both encrypt every byte; the tier also copies what the
// socket does not take at once (crypto/tls has no non-blocking write).
//
//	go test -run '^$' -bench TLSThroughput -benchtime=40x ./tiers/redis/
func BenchmarkTLSThroughput(b *testing.B) {
	srv, files, tc := startTLSRedis(b)
	cfg := DefaultConfig()
	cfg.Name = "bench"
	cfg.Addr = srv.addr
	cfg.KeyPrefix = rt.UniqueName() + ":"
	cfg.TLS = files
	cfg.Logger = slog.New(slog.DiscardHandler)
	tier, err := New(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer tier.Close(context.Background())
	bare := goredis.NewClient(&goredis.Options{Addr: srv.addr, PoolSize: cfg.PoolSize, TLSConfig: tc})
	defer bare.Close()
	for _, width := range []int{1, 8} {
		throughput(b, tier, bare, cfg.KeyPrefix, width)
	}
}

// benchConfig is a tier config for a benchmark against
// $KVTIER_TEST_REDIS_ADDR (or a redis-server of its own), with a key
// prefix of its own whose keys go when the benchmark ends.
func benchConfig(b *testing.B) Config {
	addr := os.Getenv("KVTIER_TEST_REDIS_ADDR")
	if addr == "" {
		addr = startRedis(b).addr
	}
	cfg := DefaultConfig()
	cfg.Name = "bench"
	cfg.Addr = addr
	cfg.KeyPrefix = rt.UniqueName() + ":"
	cfg.Logger = slog.New(slog.DiscardHandler)
	b.Cleanup(func() { removePrefix(addr, cfg.KeyPrefix) })
	return cfg
}

// What max_bytes costs a store: jobs of 8 new blocks into a tier whose
// max_bytes holds 8, so that each job first deletes the previous job's
// blocks (one DEL pipeline) and the ledger admits and settles it, against
// the same tier without max_bytes storing the same 8 keys over and over
// (no DEL, no ledger). Run together, whichever goes first in the process
// is favoured, so a round runs each in a process of its own, the order
// swapped every round (BENCHMARKS.md):
//
//	go test -c -o /tmp/redis.test ./tiers/redis/
//	/tmp/redis.test -test.run '^$' -test.bench 'BudgetThroughput/overwrite' -test.benchtime 40x
//	/tmp/redis.test -test.run '^$' -test.bench 'BudgetThroughput/max_bytes' -test.benchtime 40x
func BenchmarkBudgetThroughput(b *testing.B) {
	const width = 8
	base := benchConfig(b)
	arena := rt.NewArena(benchBlock, width)
	for i := range width {
		arena.Fill(int64(i), uint64(i))
	}
	for _, budget := range []bool{false, true} {
		cfg := base
		name := "overwrite"
		if budget {
			cfg.MaxBytes = confvalue.ByteSize(width * (benchBlock + remote.HeaderSize))
			name = "max_bytes_evicting"
		}
		tier, err := New(context.Background(), cfg)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(width * benchBlock))
			for i := 0; b.Loop(); i++ {
				keys := rt.Keys(0, width)
				if budget {
					keys = rt.Keys((i+1)*width, width)
				}
				if res := rt.Run(b, tier, &offload.Job{ID: uint64(i), Keys: keys, Slots: rt.Slots(0, width), Arena: arena, Req: offload.Background("b")}); !res.Success {
					b.Fatal(res.Err)
				}
			}
		})
		tier.Close(context.Background())
	}
}
