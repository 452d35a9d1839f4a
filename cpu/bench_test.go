package cpu

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kvtier/kvtier/keyspace"
	"github.com/kvtier/kvtier/offload"
)

// cpuTime returns the process's user+system CPU time. Reported per key
// next to wall time, it stays meaningful on a machine shared with other
// jobs, where wall time includes waiting for a core; it includes the GC's
// background work.
func cpuTime(b *testing.B) int64 {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// reportPerKey adds ns/key and cpu-ns/key metrics for b.N batches of n
// keys; cpu0 is cpuTime at the start of the timed loop.
func reportPerKey(b *testing.B, n int, cpu0 int64) {
	keys := float64(b.N * n)
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/keys, "ns/key")
	b.ReportMetric(float64(cpuTime(b)-cpu0)/keys, "cpu-ns/key")
}

// Benchmarks of docs/design.md §8: 36-byte keys (32-byte hash + group), 10 000
// slots.
const benchSlots = 10_000

func benchKeys(n int) []offload.Key {
	keys := make([]offload.Key, n)
	var h [32]byte
	for i := range keys {
		// Spread the bits like a real hash would.
		binary.BigEndian.PutUint64(h[:], uint64(i)*0x9e3779b97f4a7c15)
		binary.BigEndian.PutUint64(h[24:], uint64(i))
		keys[i] = offload.MakeKey(h[:], 0)
	}
	return keys
}

func benchPrimary(b *testing.B, policy string, keys []offload.Key) *Primary {
	b.Helper()
	p, err := New(Config{SlotSize: 64, Capacity: int64(64 * benchSlots), Policy: policy})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { p.Close() })
	for i := 0; i < len(keys); i += 100 {
		batch := keys[i:min(i+100, len(keys))]
		if _, ok := p.PrepareStore(batch); !ok {
			b.Fatal("fill failed")
		}
		p.CompleteStore(batch, true)
	}
	return p
}

// BenchmarkLookupHit looks up present keys; GoMap does the same lookups
// in a map[string]int of the same keys, as the yardstick.
func BenchmarkLookupHit(b *testing.B) {
	keys := benchKeys(benchSlots)
	for _, pol := range policies {
		b.Run(pol, func(b *testing.B) {
			p := benchPrimary(b, pol, keys)
			b.ReportAllocs()
			cpu0 := cpuTime(b)
			i := 0
			for b.Loop() {
				if p.Lookup(keys[i]) != offload.Hit {
					b.Fatal("miss")
				}
				if i++; i == len(keys) {
					i = 0
				}
			}
			reportPerKey(b, 1, cpu0)
		})
	}
	b.Run("GoMap", func(b *testing.B) {
		m := make(map[string]int, len(keys))
		for i, k := range keys {
			m[string(k)] = i
		}
		b.ReportAllocs()
		cpu0 := cpuTime(b)
		i := 0
		for b.Loop() {
			if _, ok := m[string(keys[i])]; !ok {
				b.Fatal("miss")
			}
			if i++; i == len(keys) {
				i = 0
			}
		}
		reportPerKey(b, 1, cpu0)
	})
}

// BenchmarkStoreEvict prepares and completes stores of 16 new keys into a
// full tier, each evicting 16 blocks; ns/key is per stored key. "into"
// uses PrepareStoreInto with one reused output, the allocation-free form
// for callers that do not keep the output.
func BenchmarkStoreEvict(b *testing.B) {
	const batch = 16
	keys := benchKeys(3 * benchSlots)
	for _, pol := range policies {
		for _, into := range []bool{false, true} {
			name := pol
			if into {
				name += "/into"
			}
			b.Run(name, func(b *testing.B) {
				p := benchPrimary(b, pol, keys[:benchSlots])
				var out offload.PrepareStoreOutput
				b.ReportAllocs()
				cpu0 := cpuTime(b)
				next := benchSlots
				for b.Loop() {
					// Keys cycle through 3× the capacity, so each batch is
					// absent again by the time it comes round.
					if next+batch > len(keys) {
						next = 0
					}
					ks := keys[next : next+batch]
					next += batch
					var ok bool
					if into {
						ok = p.PrepareStoreInto(ks, &out)
					} else {
						out, ok = p.PrepareStore(ks)
					}
					if !ok || len(out.Evicted) != batch {
						b.Fatalf("store: ok %v, %d evicted", ok, len(out.Evicted))
					}
					p.CompleteStore(ks, true)
				}
				reportPerKey(b, batch, cpu0)
			})
		}
	}
}

// BenchmarkStoreEvictGoMap is the yardstick of BenchmarkStoreEvict: the
// least a map-based LRU does for the same workload — per stored key, a
// map lookup that misses, the LRU victim's map delete and the new key's
// map insert (the key's slot is the victim's), an intrusive list append,
// and per victim a list unlink, with no states, pins, events or output
// beyond the evicted keys. No allocation per batch.
func BenchmarkStoreEvictGoMap(b *testing.B) {
	const batch = 16
	keys := benchKeys(3 * benchSlots)
	slotOf := make(map[offload.Key]int32, benchSlots)
	slotKey := make([]offload.Key, benchSlots)
	links := make([]link, benchSlots)
	lru := emptyList
	for i, k := range keys[:benchSlots] {
		slotOf[k] = int32(i)
		slotKey[i] = k
		lru.pushBack(links, int32(i))
	}
	evicted := make([]offload.Key, 0, batch)
	b.ReportAllocs()
	cpu0 := cpuTime(b)
	next := benchSlots
	for b.Loop() {
		if next+batch > len(keys) {
			next = 0
		}
		ks := keys[next : next+batch]
		next += batch
		evicted = evicted[:0]
		for _, k := range ks {
			if _, ok := slotOf[k]; ok {
				b.Fatal("present")
			}
			s := lru.head
			lru.unlink(links, s)
			evicted = append(evicted, slotKey[s])
			delete(slotOf, slotKey[s])
			slotOf[k], slotKey[s] = s, k
			lru.pushBack(links, s)
		}
	}
	reportPerKey(b, batch, cpu0)
}

// BenchmarkTouch touches batches of 16 present, evictable keys. "wire"
// touches copies of the stored keys, as a daemon decoding keys from a
// request has: comparing them costs a byte comparison, where the stored
// strings themselves compare equal by pointer.
func BenchmarkTouch(b *testing.B) {
	const batch = 16
	keys := benchKeys(benchSlots)
	wire := make([]offload.Key, len(keys))
	for i, k := range keys {
		wire[i] = offload.Key([]byte(k))
	}
	for _, pol := range policies {
		for _, copied := range []bool{false, true} {
			name, touched := pol, keys
			if copied {
				name, touched = pol+"/wire", wire
			}
			b.Run(name, func(b *testing.B) {
				p := benchPrimary(b, pol, keys)
				b.ReportAllocs()
				cpu0 := cpuTime(b)
				next := 0
				for b.Loop() {
					if next+batch > len(touched) {
						next = 0
					}
					p.Touch(touched[next : next+batch])
					next += batch
				}
				reportPerKey(b, batch, cpu0)
			})
		}
	}
}

// BenchmarkLoadCycle pins and unpins batches of 16 keys.
func BenchmarkLoadCycle(b *testing.B) {
	const batch = 16
	keys := benchKeys(benchSlots)
	for _, pol := range policies {
		b.Run(pol, func(b *testing.B) {
			p := benchPrimary(b, pol, keys)
			b.ReportAllocs()
			cpu0 := cpuTime(b)
			next := 0
			for b.Loop() {
				if next+batch > len(keys) {
					next = 0
				}
				ks := keys[next : next+batch]
				next += batch
				if _, err := p.PrepareLoad(ks); err != nil {
					b.Fatal(err)
				}
				if err := p.CompleteLoad(ks); err != nil {
					b.Fatal(err)
				}
			}
			reportPerKey(b, batch, cpu0)
		})
	}
}

// BenchmarkMetadata reports the heap bytes of a tier's metadata per slot,
// measured with 100 000 slots; key bytes belong to the caller and are not
// counted (the arena is mmapped, outside the heap).
func BenchmarkMetadata(b *testing.B) {
	const slots = 100_000
	for _, pol := range policies {
		b.Run(pol, func(b *testing.B) {
			// Measured once: b.N iterations would only repeat it.
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			p, err := New(Config{SlotSize: 8, Capacity: 8 * slots, Policy: pol})
			if err != nil {
				b.Fatal(err)
			}
			runtime.GC()
			runtime.ReadMemStats(&after)
			perSlot := float64(after.HeapAlloc-before.HeapAlloc) / slots
			runtime.KeepAlive(p)
			p.Close()
			for b.Loop() {
			}
			b.ReportMetric(perSlot, "B/slot")
		})
	}
}

func ExamplePrimary() {
	p, err := New(Config{SlotSize: 4096, Capacity: 4 * 4096, Events: true})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer p.Close()
	k := offload.MakeKey([]byte("block-hash"), 0)
	out, _ := p.PrepareStore([]offload.Key{k})
	fmt.Println(p.Lookup(k), out.Slots) // the engine now copies into the slot
	p.CompleteStore([]offload.Key{k}, true)
	fmt.Println(p.Lookup(k))
	// Output:
	// HIT_PENDING [0]
	// HIT
}

// BenchmarkStoreEvictShares is BenchmarkStoreEvict/lru/into with tenants'
// keys (tagged by keyspace): "one order" is a primary without shares,
// "shares" one divided between two tenants, the storing one above its
// quota, so that every victim is chosen across the shares.
func BenchmarkStoreEvictShares(b *testing.B) {
	const batch = 16
	acme, _ := keyspace.New("acme")
	beta, _ := keyspace.New("beta")
	raw := benchKeys(3 * benchSlots)
	keys := make([]offload.Key, len(raw))
	for i, k := range raw {
		keys[i] = acme.Key([]byte(k))
	}
	for _, shared := range []bool{false, true} {
		name := "one order"
		var shares []Share
		if shared {
			name = "shares"
			shares = []Share{{Space: acme.ID(), Slots: benchSlots / 4}, {Space: beta.ID(), Slots: benchSlots / 4}}
		}
		b.Run(name, func(b *testing.B) {
			p, err := New(Config{SlotSize: 64, Capacity: int64(64 * benchSlots), Shares: shares})
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close()
			for i := 0; i < benchSlots; i += 100 {
				batch := keys[i:min(i+100, benchSlots)]
				if _, ok := p.PrepareStore(batch); !ok {
					b.Fatal("fill failed")
				}
				p.CompleteStore(batch, true)
			}
			var out offload.PrepareStoreOutput
			b.ReportAllocs()
			cpu0 := cpuTime(b)
			next := benchSlots
			for b.Loop() {
				if next+batch > len(keys) {
					next = 0
				}
				ks := keys[next : next+batch]
				next += batch
				if !p.PrepareStoreInto(ks, &out) || len(out.Evicted) != batch {
					b.Fatalf("store: %d evicted", len(out.Evicted))
				}
				p.CompleteStore(ks, true)
			}
			reportPerKey(b, batch, cpu0)
		})
	}
}
