package wire

import (
	"bytes"
	"testing"

	"google.golang.org/grpc/mem"

	kvtierv1 "github.com/kvtier/kvtier/api/kvtier/v1"
)

func TestPoolClasses(t *testing.T) {
	p := newPool(minClass, maxClass)
	for _, tc := range []struct{ n, cap int }{{0, 256}, {1, 256}, {256, 256}, {257, 512}, {40 << 10, 64 << 10}, {64 << 20, 64 << 20}, {64<<20 + 1, 64<<20 + 1}} {
		b := p.Get(tc.n)
		if len(*b) != tc.n || cap(*b) != tc.cap {
			t.Errorf("Get(%d): len %d cap %d, want cap %d", tc.n, len(*b), cap(*b), tc.cap)
		}
		p.Put(b)
	}
	odd := make([]byte, 300)
	p.Put(&odd) // not a class size: ignored
	if b := p.Get(300); cap(*b) != 512 {
		t.Errorf("foreign buffer came back from the pool: cap %d", cap(*b))
	}
}

// TestCodecRoundTrip reuses dirty pooled buffers and still decodes exactly
// what was encoded.
func TestCodecRoundTrip(t *testing.T) {
	var c Codec
	for i, size := range []int{10, 70 << 10, 40 << 10, 3 << 20, 100} {
		in := &kvtierv1.PutBlocksRequest{RequestId: "r", Blocks: []*kvtierv1.Block{{Key: []byte("hash-key"), Data: bytes.Repeat([]byte{byte(i + 1)}, size)}}}
		data, err := c.Marshal(in)
		if err != nil {
			t.Fatal(err)
		}
		var out kvtierv1.PutBlocksRequest
		if err := c.Unmarshal(data, &out); err != nil {
			t.Fatal(err)
		}
		data.Free()
		if !bytes.Equal(out.GetBlocks()[0].GetData(), in.GetBlocks()[0].GetData()) || out.GetRequestId() != "r" {
			t.Fatalf("size %d: round trip changed the message", size)
		}
	}
	if _, err := c.Marshal(struct{}{}); err == nil {
		t.Fatal("marshalled a non-proto value")
	}
	if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer([]byte{0xff})}, &kvtierv1.LookupRequest{}); err == nil {
		t.Fatal("decoded garbage")
	}
}
