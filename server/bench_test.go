package server_test

import (
	"bytes"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/offload"
)

func noTiers(envT) []offload.SecondaryTier { return nil }

// BenchmarkLookup1000Unix is one batched Lookup of a 1 000-key prefix held
// in the primary, over the Unix socket (docs/design.md §8: ≤ 200 µs median).
func BenchmarkLookup1000Unix(b *testing.B) {
	const n = 1000
	e := startEnv(b, envOptions{slots: 1024, tiers: noTiers})
	ctx := ctxT(b)
	c := e.dial(b, e.unix)
	ks := putPrefix(b, c, n)
	if _, err := c.NewRequest(ctx, "bench", ""); err != nil {
		b.Fatal(err)
	}
	lat := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		start := time.Now()
		_, hits, err := c.Lookup(ctx, "bench", ks, true)
		lat = append(lat, time.Since(start))
		if err != nil || hits != n {
			b.Fatalf("hits %d err %v", hits, err)
		}
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "median-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}

// BenchmarkResidency1000Unix is one Residency query of a 1 000-key prefix
// over the Unix socket (issue 41: ≤ 1 ms median): the primary holds it
// all, and two tiers that can tell (memory tiers, as fs) hold it too, so
// every key is checked in the primary and in both; a third tier, which
// cannot tell without I/O, is not asked. Run it beside
// BenchmarkLookup1000Unix, the engine's lookup of the same prefix:
//
//	go test -run '^$' -bench 'Residency1000Unix|Lookup1000Unix' -count 5 ./server/
func BenchmarkResidency1000Unix(b *testing.B) {
	const n = 1000
	mts, tiers := steerTiers(b)
	e := startEnv(b, envOptions{slots: 1024, tiers: tiers})
	ctx := ctxT(b)
	c := e.dial(b, e.unix)
	ks := putPrefix(b, c, n)
	for _, m := range mts[:2] {
		for _, k := range ks {
			m.Put(k, nil)
		}
	}
	lat := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		start := time.Now()
		r, err := c.Residency(ctx, ks, "")
		lat = append(lat, time.Since(start))
		if err != nil || r.GetLoadable() != n || r.GetTiers()[1].GetRun() != n {
			b.Fatalf("%v %v", r, err)
		}
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "median-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}

const bigBlock = 2 << 20 // 2 MiB, the default bytes_per_block

// BenchmarkPutGetBlocks2MiB stores and loads 8 blocks of 2 MiB per call
// by value over the Unix socket; MB/s counts the bytes of one direction.
func BenchmarkPutGetBlocks2MiB(b *testing.B) {
	const perCall = 8
	for _, dir := range []string{"put", "get"} {
		b.Run(dir, func(b *testing.B) {
			p, err := newBigEnv(b)
			if err != nil {
				b.Fatal(err)
			}
			ctx := ctxT(b)
			c := p.dial(b, p.unix)
			blocks := make([]client.Block, perCall)
			ks := make([]offload.Key, perCall)
			for i := range blocks {
				ks[i] = key(i)
				blocks[i] = client.Block{Key: ks[i], Data: bytes.Repeat([]byte{byte(i + 1)}, bigBlock)}
			}
			if dir == "get" {
				if _, err := c.PutBlocks(ctx, blocks, client.CallOptions{}); err != nil {
					b.Fatal(err)
				}
			}
			b.SetBytes(perCall * bigBlock)
			b.ResetTimer()
			for b.Loop() {
				if dir == "put" {
					// Reset so every call really writes its blocks.
					b.StopTimer()
					if err := c.Reset(ctx); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
					if _, err := c.PutBlocks(ctx, blocks, client.CallOptions{}); err != nil {
						b.Fatal(err)
					}
					continue
				}
				got, err := c.GetBlocks(ctx, ks, client.GetOptions{})
				if err != nil || got.Hits != perCall {
					b.Fatalf("hits %d err %v", got.Hits, err)
				}
			}
		})
	}
	// The baseline: copying the same bytes once within the process.
	b.Run("rawcopy", func(b *testing.B) {
		src := make([][]byte, perCall)
		dst := make([][]byte, perCall)
		for i := range src {
			src[i] = bytes.Repeat([]byte{byte(i + 1)}, bigBlock)
			dst[i] = make([]byte, bigBlock)
		}
		b.SetBytes(perCall * bigBlock)
		for b.Loop() {
			for i := range src {
				copy(dst[i], src[i])
			}
		}
	})
}

// BenchmarkArenaStoreLoad2MiB is the same traffic through the mapped
// arena, as an engine on the same host moves it: the bytes are copied
// once into (or out of) the slots, and only keys and slot numbers cross
// the socket.
func BenchmarkArenaStoreLoad2MiB(b *testing.B) {
	const perCall = 8
	for _, dir := range []string{"store", "load"} {
		b.Run(dir, func(b *testing.B) {
			e, _ := newBigEnv(b)
			ctx := ctxT(b)
			c := e.dial(b, e.unix)
			a, err := c.MapArena(ctx)
			if err != nil {
				b.Fatal(err)
			}
			defer a.Close()
			ks := make([]offload.Key, perCall)
			src := make([][]byte, perCall)
			for i := range ks {
				ks[i] = key(i)
				src[i] = bytes.Repeat([]byte{byte(i + 1)}, bigBlock)
			}
			store := func(id string) {
				res, err := c.PrepareStore(ctx, id, ks, nil)
				if err != nil || !res.OK {
					b.Fatalf("prepare store: %v", err)
				}
				for i, s := range res.Slots {
					dst, _ := a.Slot(s)
					copy(dst, src[i])
				}
				if err := c.CompleteStore(ctx, id, res.Keys, true); err != nil {
					b.Fatal(err)
				}
			}
			if _, err := c.NewRequest(ctx, "bench", ""); err != nil {
				b.Fatal(err)
			}
			if dir == "load" {
				store("bench")
			}
			b.SetBytes(perCall * bigBlock)
			b.ResetTimer()
			for b.Loop() {
				if dir == "store" {
					b.StopTimer()
					if err := c.Reset(ctx); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
					store("bench")
					continue
				}
				if _, hits, err := c.Lookup(ctx, "bench", ks, true); err != nil || hits != perCall {
					b.Fatalf("lookup: %d %v", hits, err)
				}
				slots, err := c.PrepareLoad(ctx, "bench", ks)
				if err != nil {
					b.Fatal(err)
				}
				for i, s := range slots {
					from, _ := a.Slot(s)
					copy(src[i], from)
				}
				if err := c.CompleteLoad(ctx, "bench", ks); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// newBigEnv is a daemon with 2 MiB slots and no secondary tiers, so the
// figures measure the API path only.
func newBigEnv(b *testing.B) (*env, error) {
	b.Helper()
	return startEnvSlot(b, envOptions{slots: 16, tiers: noTiers}, bigBlock), nil
}

// putPrefix stores n blocks through c and returns their keys: 36-byte
// keys, a 32-byte hash and the group index, as in docs/design.md §8.
func putPrefix(b *testing.B, c *client.Client, n int) []offload.Key {
	ks := make([]offload.Key, n)
	blocks := make([]client.Block, n)
	for i := range ks {
		ks[i] = offload.MakeKey([]byte(fmt.Sprintf("%032d", i)), 0)
		blocks[i] = client.Block{Key: ks[i], Data: make([]byte, slotSize)}
	}
	if _, err := c.PutBlocks(ctxT(b), blocks, client.CallOptions{}); err != nil {
		b.Fatal(err)
	}
	return ks
}
