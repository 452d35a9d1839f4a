package offload_test

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/kvtier/kvtier/offload"
)

// benchTiers cycles through every valid declaration (8 of the 9 pairs
// plus a dynamic one) so that the benchmark is not one predicted branch.
var benchTiers = [8]declaredTier{
	{"fs", storage, local}, {"s3", storage, remote}, {"redis", cpu, remote}, {"peer", anyM, anyL},
	{"cpu-local", cpu, local}, {"storage", storage, anyL}, {"cpu", cpu, anyL}, {"remote", anyM, remote},
}

var benchSink int

// The Allows benchmarks use a b.N loop rather than b.Loop: b.Loop keeps
// calls in its body from being inlined, and the hot path relies on
// Allows inlining into the manager's loop.

func BenchmarkAllows(b *testing.B) {
	f := offload.NewTierFilter(M(cpu, remote), M(storage, local))
	n := 0
	for i := 0; i < b.N; i++ {
		t := &benchTiers[i&7]
		if f.Allows(t.m, t.l) {
			n++
		}
	}
	benchSink = n
}

func BenchmarkAllowsAll(b *testing.B) {
	f := offload.All()
	n := 0
	for i := 0; i < b.N; i++ {
		t := &benchTiers[i&7]
		if f.Allows(t.m, t.l) {
			n++
		}
	}
	benchSink = n
}

// BenchmarkAllowsBaseline walks the same tiers with a trivial test in
// place of the filter: the loop's own cost, for the ratio.
func BenchmarkAllowsBaseline(b *testing.B) {
	n := 0
	for i := 0; i < b.N; i++ {
		t := &benchTiers[i&7]
		if uint8(t.m)+uint8(t.l) >= 3 {
			n++
		}
	}
	benchSink = n
}

var benchParams = []byte(`{"kv_load_tiers":[{"medium":"cpu","locality":"remote"},{"medium":"storage","locality":"local"}],"request_id":"abc"}`)

func BenchmarkNewReqContext(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		rc, err := offload.NewReqContext("req", benchParams)
		if err != nil || rc.LoadFilter.IsAll() {
			b.Fatal(rc, err)
		}
	}
}

// BenchmarkNewReqContextBaseline decodes the same bytes the way the
// parser does but builds no filter: the cost of JSON alone.
func BenchmarkNewReqContextBaseline(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		dec := json.NewDecoder(bytes.NewReader(benchParams))
		dec.UseNumber()
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			b.Fatal(err)
		}
	}
}

func TestAllowsDoesNotAllocate(t *testing.T) {
	f := offload.NewTierFilter(M(cpu, remote), M(storage, local))
	n := testing.AllocsPerRun(100, func() {
		for _, d := range benchTiers {
			if f.Allows(d.m, d.l) {
				benchSink++
			}
		}
	})
	if n != 0 {
		t.Fatalf("Allows allocates %v times per run", n)
	}
}
