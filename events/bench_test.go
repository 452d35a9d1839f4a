package events

import (
	"testing"

	"github.com/kvtier/kvtier/offload"
)

// benchEncode translates and encodes batches of n stored keys (36-byte
// keys like the peer's) and reports block events per second.
func benchEncode(b *testing.B, n int, selfDescribing bool, f Format) {
	tr, err := NewTracker(TrackerConfig{SelfDescribing: selfDescribing})
	if err != nil {
		b.Fatal(err)
	}
	keys := make([]offload.Key, n)
	for i := range keys {
		var m TokenMeta
		m.BlockSize = 16
		hash := make([]byte, 32)
		hash[0], hash[31] = byte(i>>8), byte(i)
		m.BlockHashes = [][]byte{hash}
		m.TokenIDs = toks(16*i, 16)
		keys[i] = offload.MakeKey(hash, 0)
		if selfDescribing {
			if _, err := tr.Record(keys[i], m); err != nil {
				b.Fatal(err)
			}
		}
	}
	evs := []offload.Event{{Keys: keys, Medium: offload.MediumCPU}}
	var batch Batch
	var buf []byte
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		batch.Reset()
		tr.Translate(&batch, evs)
		buf = f.AppendBatch(buf[:0], 1789095808.83, batch.Events, 0)
	}
	b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "events/s")
	b.SetBytes(int64(len(buf)))
}

func BenchmarkEncodePlaceholder64(b *testing.B)    { benchEncode(b, 64, false, Format{}) }
func BenchmarkEncodePlaceholder1024(b *testing.B)  { benchEncode(b, 1024, false, Format{}) }
func BenchmarkEncodeSelfDescribing64(b *testing.B) { benchEncode(b, 64, true, Format{}) }
func BenchmarkEncodePositional64(b *testing.B)     { benchEncode(b, 64, false, Format{Positional: true}) }
func BenchmarkEncodeRawHashes64(b *testing.B)      { benchEncode(b, 64, false, Format{RawHashes: true}) }

// BenchmarkEncodeRemoved64 measures removals: 64 keys over 2 KV groups
// give two BlockRemoved events of 32 hashes; reported per removed block.
func BenchmarkEncodeRemoved64(b *testing.B) {
	tr, _ := NewTracker(TrackerConfig{})
	keys := make([]offload.Key, 64)
	for i := range keys {
		keys[i] = chunkKey(uint64(i)<<40|uint64(i), uint32(i%2))
	}
	evs := []offload.Event{{Keys: keys, Medium: offload.MediumStorage, Removed: true}}
	var batch Batch
	var buf []byte
	b.ReportAllocs()
	for b.Loop() {
		batch.Reset()
		tr.Translate(&batch, evs)
		buf = Format{}.AppendBatch(buf[:0], 1, batch.Events, 0)
	}
	b.ReportMetric(float64(b.N*len(keys))/b.Elapsed().Seconds(), "blocks/s")
}
