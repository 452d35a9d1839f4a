package workload

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
)

// BenchmarkReplay replays the 2 000-request trace prefix through a fresh
// stack per iteration and reports the cost per key (one key = one block
// looked up, and loaded or stored) and per request.
func BenchmarkReplay(b *testing.B) {
	reqs := loadPrefix(b)
	var keys int
	for _, r := range reqs {
		keys += len(r.HashIDs)
	}
	cases := []struct {
		name string
		opts func() Options
	}{
		{"primary-1000", func() Options { return Options{PrimaryBlocks: 1000} }},
		{"primary-5859", func() Options { return Options{PrimaryBlocks: 5859} }},
		{"primary-5859-arc", func() Options { return Options{PrimaryBlocks: 5859, Policy: "arc"} }},
		{"primary-5859+memory", func() Options {
			cfg := mustConfig(b, "secondary_tiers:\n  - name: big\n    type: memory\n    medium: cpu\n    locality: remote\n")
			return Options{PrimaryBlocks: 5859, Config: cfg}
		}},
	}
	for _, bc := range cases {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			var elapsed float64
			var hitRate float64
			for b.Loop() {
				res, err := Replay(context.Background(), Requests(reqs), bc.opts())
				if err != nil {
					b.Fatal(err)
				}
				elapsed += float64(res.Elapsed.Nanoseconds())
				hitRate = res.HitRate
			}
			// ns/op includes building and closing the stack; these do not.
			b.ReportMetric(elapsed/float64(b.N)/float64(keys), "ns/key")
			b.ReportMetric(elapsed/float64(b.N)/float64(len(reqs)), "ns/req")
			b.ReportMetric(hitRate, "hit-rate")
		})
	}
}

// BenchmarkReader parses the 2 000-request trace prefix from memory.
func BenchmarkReader(b *testing.B) {
	reqs := loadPrefix(b)
	var buf bytes.Buffer
	for _, r := range reqs {
		json.NewEncoder(&buf).Encode(map[string]any{
			"timestamp": r.Timestamp, "input_length": r.InputLength,
			"output_length": r.OutputLength, "hash_ids": r.HashIDs,
		})
	}
	data := buf.Bytes()
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		got, err := ReadAll(bytes.NewReader(data), ReaderOptions{})
		if err != nil || len(got) != len(reqs) {
			b.Fatal(len(got), err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(reqs)), "ns/req")
}
