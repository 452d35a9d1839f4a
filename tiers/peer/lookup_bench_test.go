package peer

import (
	"fmt"
	"testing"

	"github.com/kvtier/kvtier/offload"
)

// BenchmarkIndexedLookup1000 is the tier's own cost of a 1 000-key prefix
// answered from a current index, without a daemon beside it: one Lookup
// per key, as the manager calls it.
func BenchmarkIndexedLookup1000(b *testing.B) {
	const n = 1000
	p := &peer{locality: offload.LocalityLocal, hints: newHints(DefaultIndexMaxKeys)}
	keys := make([]offload.Key, n)
	for i := range keys {
		keys[i] = offload.MakeKey([]byte(fmt.Sprintf("%032d", i)), 0)
		p.hints.add(keyTag(keys[i]), onCPU)
	}
	p.indexed.Store(true)
	t := &Tier{peers: []*peer{p}}
	req, _ := offload.NewReqContext("bench", nil)
	b.ReportAllocs()
	for b.Loop() {
		for _, k := range keys {
			if t.Lookup(k, req) != offload.Hit {
				b.Fatal("miss")
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/1000, "µs/prefix")
}
