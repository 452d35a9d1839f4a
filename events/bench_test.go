package events

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvtier/kvtier/events/zmtp"
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

// benchPublish publishes batches of 64 placeholder events; with sub, a Go
// subscriber reads and discards them over loopback TCP.
func benchPublish(b *testing.B, sub bool) {
	p, err := New(Config{Endpoint: "tcp://127.0.0.1:0", Mode: ModeBind, Host: "h", Model: "m"})
	if err != nil {
		b.Fatal(err)
	}
	var received atomic.Int64
	done := make(chan struct{})
	if sub {
		c, err := zmtp.Dial(context.Background(), "tcp://"+p.Addr().String(), zmtp.Sub, nil)
		if err != nil {
			b.Fatal(err)
		}
		_ = c.Subscribe(nil)
		for len(p.Stats().Subscribers) == 0 || p.Stats().Subscribers[0].Subscriptions == 0 {
			time.Sleep(time.Millisecond)
		}
		go func() {
			defer close(done)
			for {
				if _, err := c.Recv(); err != nil {
					return
				}
				received.Add(1)
			}
		}()
	} else {
		close(done)
	}
	keys := make([]offload.Key, 64)
	for i := range keys {
		keys[i] = chunkKey(uint64(i)*0x9e3779b97f4a7c15, 0)
	}
	evs := []offload.Event{{Keys: keys, Medium: offload.MediumCPU}}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if err := p.Publish(evs); err != nil {
			b.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.Close(ctx); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	<-done
	st := p.Stats()
	b.ReportMetric(float64(b.N*len(keys))/b.Elapsed().Seconds(), "events/s")
	if sub {
		b.ReportMetric(float64(received.Load())/float64(b.N), "delivered/op")
	}
	b.ReportMetric(float64(st.BatchesDropped+st.SubscriberDrops), "dropped")
}

// BenchmarkPublish64 is the daemon's cost per step: translate, encode,
// queue (the sender goroutine runs concurrently).
func BenchmarkPublish64(b *testing.B) { benchPublish(b, false) }

// BenchmarkPublish64Subscriber includes delivery to a subscriber reading
// over loopback TCP; the timer covers Close, which drains the queues.
func BenchmarkPublish64Subscriber(b *testing.B) { benchPublish(b, true) }
