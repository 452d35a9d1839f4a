package tiering

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/kvtier/kvtier/cpu"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/tiers/memory"
)

// Benchmark shapes follow docs/design.md §8: 36-byte keys (sha256 + group),
// LRU, a 10 000-slot primary, three in-memory secondary tiers.

const (
	benchSlots    = 10_000
	benchSlotSize = 256
)

func benchKey(i int) offload.Key {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(i))
	h := sha256.Sum256(b[:])
	return offload.MakeKey(h[:], 0)
}

func benchKeys(from, n int) []offload.Key {
	ks := make([]offload.Key, n)
	for i := range ks {
		ks[i] = benchKey(from + i)
	}
	return ks
}

// benchManager builds the primary and three memory tiers: two CPU tiers
// and a STORAGE tier third.
func benchManager(b *testing.B, tierCapacity int) (*Manager, []*memory.Tier) {
	b.Helper()
	p, err := cpu.New(cpu.Config{SlotSize: benchSlotSize, Capacity: benchSlots * benchSlotSize})
	if err != nil {
		b.Fatal(err)
	}
	var tiers []*memory.Tier
	var sec []offload.SecondaryTier
	for i, m := range []offload.Medium{offload.MediumCPU, offload.MediumCPU, offload.MediumStorage} {
		t, err := memory.New(memory.Config{Name: string(rune('a' + i)), Medium: m, Locality: offload.LocalityLocal, CapacityBlocks: tierCapacity})
		if err != nil {
			b.Fatal(err)
		}
		tiers = append(tiers, t)
		sec = append(sec, t)
	}
	m, err := New(Config{Primary: p, Tiers: sec})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = m.Close(context.Background()) })
	return m, tiers
}

// BenchmarkLookupPrefixPrimary: the daemon's batched lookup of a 1 000-key
// prefix that is entirely in the primary.
func BenchmarkLookupPrefixPrimary(b *testing.B) {
	m, _ := benchManager(b, 0)
	req := reqWith("r", nil, nil)
	m.OnNewRequest(req)
	keys := benchKeys(0, 1000)
	out, ok, err := m.PrepareStore(keys, req)
	if err != nil || !ok {
		b.Fatal(ok, err)
	}
	if err := m.CompleteStore(out.KeysToStore, req, true); err != nil {
		b.Fatal(err)
	}
	for m.HasPendingWork() {
		m.ScheduleEnd(offload.ScheduleEnd{})
	}
	res := make([]offload.LookupResult, len(keys))
	b.ReportAllocs()
	b.ResetTimer()
	cpuTime := startThreadCPU(b)
	for b.Loop() {
		if n := m.LookupPrefix(keys, req, res); n != len(keys) {
			b.Fatalf("hits %d", n)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(keys)), "ns/key")
	cpuTime.report(b, b.N*len(keys), "cpu-ns/key")
}

// thirdTierWorkload looks up keys held only by the third tier; each lookup
// asks the tiers the filter allows and reserves the promotion slot. It has
// two disjoint key sets so that two variants can share one manager (same
// memory layout, same caches); the primary is reset (untimed) before the
// reservations fill it.
type thirdTierWorkload struct {
	m    *Manager
	keys [2][]offload.Key
	next int
}

const thirdTierKeys = benchSlots / 2

func newThirdTierWorkload(b *testing.B) *thirdTierWorkload {
	m, tiers := benchManager(b, 0)
	w := &thirdTierWorkload{m: m}
	data := make([]byte, benchSlotSize)
	for set := range w.keys {
		w.keys[set] = benchKeys(1_000_000*(set+1), thirdTierKeys)
		for _, k := range w.keys[set] {
			tiers[2].Put(k, data)
		}
	}
	return w
}

// room makes sure n more keys of every set can be looked up, resetting the
// manager if not; it reports whether it reset.
func (w *thirdTierWorkload) room(b *testing.B, n int) bool {
	if w.next+n <= thirdTierKeys {
		return false
	}
	if err := w.m.Reset(context.Background()); err != nil {
		b.Fatal(err)
	}
	w.next = 0
	return true
}

// lookup looks up n keys of one set starting at w.next (room was made).
func (w *thirdTierWorkload) lookup(b *testing.B, set int, req *offload.ReqContext, n int) {
	for _, k := range w.keys[set][w.next : w.next+n] {
		if r := w.m.Lookup(k, req); r != offload.Retry {
			b.Fatalf("lookup = %v", r)
		}
	}
}

var (
	filterAll     = offload.All()
	filterStorage = offload.NewTierFilter(offload.TierMatcher{Medium: offload.MediumStorage})
	// filterBoth allows every tier but is not the All sentinel: the pure
	// cost of evaluating a filter.
	filterBoth = offload.NewTierFilter(offload.TierMatcher{Medium: offload.MediumCPU}, offload.TierMatcher{Medium: offload.MediumStorage})
)

// BenchmarkLookupThirdTier: key only in the 3rd of 3 tiers, including the
// promotion slot reservation; without a filter, and with a filter that
// excludes tiers 1–2. One op is one key.
func BenchmarkLookupThirdTier(b *testing.B) {
	for _, bc := range []struct {
		name   string
		filter *offload.TierFilter
	}{
		{"filter=none", filterAll},
		{"filter=storage", filterStorage},
	} {
		b.Run(bc.name, func(b *testing.B) {
			w := newThirdTierWorkload(b)
			req := reqWith("r", bc.filter, nil)
			b.ReportAllocs()
			cpuTime := startThreadCPU(b)
			var untimed time.Duration
			for b.Loop() {
				if w.next == thirdTierKeys {
					b.StopTimer()
					t0 := threadTime()
					w.room(b, 1)
					untimed += threadTime() - t0
					b.StartTimer()
				}
				w.lookup(b, 0, req, 1)
				w.next++
			}
			cpuTime.start += untimed
			cpuTime.report(b, b.N, "cpu-ns/key")
		})
	}
}

// BenchmarkFilterRatio runs one workload with and without a filter on one
// manager and reports time(filter) / time(no filter). Each op runs four
// chunks of 500 lookups so that each variant uses each of the two key sets
// once and goes first once, cancelling order and data-layout effects; the
// reported ratio is the median over ops (robust to a noisy machine) and
// the ratio of the totals. "excluding" skips tiers 1–2; "allowing" allows
// all three tiers through a non-sentinel filter: the pure cost of the
// check, which should be 1.
func BenchmarkFilterRatio(b *testing.B) {
	for _, bc := range []struct {
		name   string
		filter *offload.TierFilter
	}{
		{"excluding", filterStorage},
		{"allowing", filterBoth},
	} {
		b.Run(bc.name, func(b *testing.B) {
			const chunk = 500
			w := newThirdTierWorkload(b)
			reqs := [2]*offload.ReqContext{reqWith("off", filterAll, nil), reqWith("on", bc.filter, nil)}
			var total [2]time.Duration
			var ratios []float64
			for b.Loop() {
				b.StopTimer()
				w.room(b, 2*chunk)
				b.StartTimer()
				var d [2]time.Duration
				for half := range 2 {
					for j := range 2 {
						v := j ^ half // variant: 0 off, 1 on; swaps order and set
						start := time.Now()
						w.lookup(b, v^half, reqs[v], chunk)
						d[v] += time.Since(start)
					}
					w.next += chunk
				}
				total[0] += d[0]
				total[1] += d[1]
				ratios = append(ratios, float64(d[1])/float64(d[0]))
			}
			slices.Sort(ratios)
			b.ReportMetric(ratios[len(ratios)/2], "median-ratio")
			b.ReportMetric(float64(total[1])/float64(total[0]), "total-ratio")
			b.ReportMetric(float64(total[0].Nanoseconds())/float64(b.N*2*chunk), "ns/key-off")
			b.ReportMetric(float64(total[1].Nanoseconds())/float64(b.N*2*chunk), "ns/key-on")
		})
	}
}

// exampleTier is upstream's example tier, the shape of the Python peer's
// full-cycle figure: key presence only, jobs answered synchronously. It
// forgets everything when it reaches its capacity, to stay bounded.
type exampleTier struct {
	keys     map[offload.Key]struct{}
	capacity int
	results  []offload.JobResult
	medium   offload.Medium
}

func (t *exampleTier) Name() string               { return fmt.Sprintf("example%p", t) }
func (t *exampleTier) Type() string               { return "example" }
func (t *exampleTier) Medium() offload.Medium     { return t.medium }
func (t *exampleTier) Locality() offload.Locality { return offload.LocalityLocal }
func (t *exampleTier) Lookup(k offload.Key, _ *offload.ReqContext) offload.LookupResult {
	if _, ok := t.keys[k]; ok {
		return offload.Hit
	}
	return offload.Miss
}

func (t *exampleTier) SubmitStore(j *offload.Job) {
	if t.keys == nil { // null tier: answers only
		t.results = append(t.results, offload.JobResult{JobID: j.ID, Success: true})
		return
	}
	if len(t.keys)+len(j.Keys) > t.capacity {
		clear(t.keys)
	}
	for _, k := range j.Keys {
		t.keys[k] = struct{}{}
	}
	t.results = append(t.results, offload.JobResult{JobID: j.ID, Success: true})
}

func (t *exampleTier) SubmitLoad(j *offload.Job) {
	t.results = append(t.results, offload.JobResult{JobID: j.ID, Success: true})
}

func (t *exampleTier) FinishedJobs() []offload.JobResult {
	r := t.results
	t.results = t.results[:0] // reuse the array: the manager is done with r before the next submit
	return r
}

func (t *exampleTier) DrainJobs(context.Context) error          { return nil }
func (t *exampleTier) HasPendingWork() bool                     { return len(t.results) > 0 }
func (t *exampleTier) Touch([]offload.Key, *offload.ReqContext) {}
func (t *exampleTier) OnNewRequest(*offload.ReqContext) offload.OffloadPolicy {
	return offload.BlockLevel
}
func (t *exampleTier) OnRequestFinished(*offload.ReqContext) {}
func (t *exampleTier) OnScheduleEnd(offload.ScheduleEnd)     {}
func (t *exampleTier) TakeEvents() []offload.Event           { return nil }
func (t *exampleTier) Close(context.Context) error           { return nil }

// BenchmarkFullCycle: per key, PrepareStore → CompleteStore → cascade to 3
// tiers → ScheduleEnd, in batches of 16 new keys with the primary (and
// the memory tiers) full, so every batch evicts 16 blocks. "memory" uses
// memory tiers that copy the 256-byte blocks; "example3" uses key-only
// tiers like the Python peer's measurement; "null3" uses tiers that only
// answer (no key set), the manager's and the primary's share of the
// example3 cycle; "example0" has no secondary tier, the primary's share.
// "/into" stores with PrepareStoreInto and one reused output, as a daemon
// that encodes the output before the next call can.
func BenchmarkFullCycle(b *testing.B) {
	b.Run("tiers=memory", func(b *testing.B) {
		m, _ := benchManager(b, benchSlots)
		fullCycle(b, m, false)
	})
	for _, bc := range []struct {
		name string
		n    int
		null bool
	}{{"example3", 3, false}, {"null3", 3, true}, {"example0", 0, false}} {
		for _, into := range []bool{false, true} {
			name := "tiers=" + bc.name
			if into {
				name += "/into"
			}
			b.Run(name, func(b *testing.B) {
				p, err := cpu.New(cpu.Config{SlotSize: benchSlotSize, Capacity: benchSlots * benchSlotSize})
				if err != nil {
					b.Fatal(err)
				}
				var tiers []offload.SecondaryTier
				for range bc.n {
					t := &exampleTier{keys: map[offload.Key]struct{}{}, capacity: benchSlots, medium: offload.MediumCPU}
					if bc.null {
						t.keys = nil
					}
					tiers = append(tiers, t)
				}
				m, err := New(Config{Primary: p, Tiers: tiers})
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { _ = m.Close(context.Background()) })
				fullCycle(b, m, into)
			})
		}
	}
}

func fullCycle(b *testing.B, m *Manager, into bool) {
	const batch = 16
	req := reqWith("r", nil, nil)
	m.OnNewRequest(req)
	next := 0
	for range benchSlots/batch + 1 { // fill everything first
		keys := benchKeys(next, batch)
		next += batch
		out, ok, err := m.PrepareStore(keys, req)
		if err != nil || !ok {
			b.Fatalf("prepare store: ok=%v err=%v", ok, err)
		}
		if err := m.CompleteStore(out.KeysToStore, req, true); err != nil {
			b.Fatal(err)
		}
		m.ScheduleEnd(offload.ScheduleEnd{})
	}
	// Key generation (sha256) is not part of the cycle: keys are made
	// outside the timer and their allocations subtracted.
	var before, after, genStart, genEnd runtime.MemStats
	var genMallocs uint64
	gen := func() []offload.Key {
		runtime.ReadMemStats(&genStart)
		ks := benchKeys(next, 1<<14)
		next += len(ks)
		runtime.ReadMemStats(&genEnd)
		genMallocs += genEnd.Mallocs - genStart.Mallocs
		return ks
	}
	pre := gen()
	genMallocs = 0
	runtime.ReadMemStats(&before)
	b.ResetTimer()
	cpuTime := startThreadCPU(b)
	var untimed time.Duration
	var out offload.PrepareStoreOutput
	i := 0
	for b.Loop() {
		if i+batch > len(pre) {
			b.StopTimer()
			t0 := threadTime()
			pre, i = gen(), 0
			untimed += threadTime() - t0
			b.StartTimer()
		}
		keys := pre[i : i+batch]
		i += batch
		var ok bool
		var err error
		if into {
			ok, err = m.PrepareStoreInto(keys, req, &out)
		} else {
			out, ok, err = m.PrepareStore(keys, req)
		}
		if err != nil || !ok || len(out.Evicted) != batch {
			b.Fatalf("prepare store: ok=%v err=%v evicted %d", ok, err, len(out.Evicted))
		}
		if err := m.CompleteStore(out.KeysToStore, req, true); err != nil {
			b.Fatal(err)
		}
		m.ScheduleEnd(offload.ScheduleEnd{})
	}
	b.StopTimer()
	runtime.ReadMemStats(&after)
	keys := float64(b.N * batch)
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/keys, "ns/key")
	b.ReportMetric(float64(after.Mallocs-before.Mallocs-genMallocs)/keys, "allocs/key")
	cpuTime.start += untimed
	cpuTime.report(b, b.N*batch, "cpu-ns/key")
}
