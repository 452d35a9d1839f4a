// Package wire is the gRPC codec the kvtier daemon and its Go client use:
// protobuf, like gRPC's default, but with buffers from a pool whose size
// classes are powers of two. gRPC's default pool jumps from 32 KiB to
// 1 MiB and clears every buffer it hands out, so a 40 KiB Lookup of 1 000
// keys would clear a megabyte on each side of every call.
package wire

import (
	"fmt"
	"math/bits"
	"sync"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

// Transport sizes for both ends. A window of 16 MiB lets one PutBlocks of
// eight 2 MiB blocks go out without waiting for flow-control updates
// (setting a window also turns off gRPC's dynamic window estimation);
// 256 KiB socket buffers cut the system calls per megabyte.
const (
	WindowSize   = 16 << 20
	IOBufferSize = 256 << 10
)

// Pool has power-of-two classes from 256 bytes to 64 MiB. Unlike gRPC's
// pools it does not clear buffers: every user of a pooled buffer here
// overwrites the whole requested length before reading it (marshalling
// appends exactly the message size, materialising and frame reads copy
// their full length), and clearing 16 MiB per PutBlocks cost a fifth of
// the call.
var Pool mem.BufferPool = newPool(minClass, maxClass)

const (
	minClass = 8  // 256 B
	maxClass = 26 // 64 MiB
)

type pool struct {
	min, max int
	classes  []sync.Pool // classes[i] holds buffers of capacity 1<<(min+i)
}

func newPool(min, max int) *pool {
	return &pool{min: min, max: max, classes: make([]sync.Pool, max-min+1)}
}

// class returns the size class of a buffer of n bytes, or -1 when n is
// larger than the largest class.
func (p *pool) class(n int) int {
	c := bits.Len(uint(n - 1))
	if n <= 1 || c < p.min {
		c = p.min
	}
	if c > p.max {
		return -1
	}
	return c - p.min
}

// Get returns a buffer of length n whose contents are unspecified.
func (p *pool) Get(n int) *[]byte {
	i := p.class(n)
	if i < 0 {
		b := make([]byte, n)
		return &b
	}
	if v := p.classes[i].Get(); v != nil {
		bp := v.(*[]byte)
		*bp = (*bp)[:n]
		return bp
	}
	b := make([]byte, n, 1<<(p.min+i))
	return &b
}

// Put returns a buffer obtained from Get.
func (p *pool) Put(bp *[]byte) {
	c := cap(*bp)
	i := p.class(c)
	if i < 0 || c != 1<<(p.min+i) {
		return // not one of ours
	}
	p.classes[i].Put(bp)
}

// Codec is a protobuf codec drawing buffers from Pool. Use it with
// grpc.ForceServerCodecV2 and grpc.ForceCodecV2.
type Codec struct{}

var _ encoding.CodecV2 = Codec{}

// Name is "proto": on the wire nothing changes.
func (Codec) Name() string { return "proto" }

// Marshal encodes v into a pooled buffer.
func (Codec) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("wire: marshal %T: not a proto.Message", v)
	}
	size := proto.Size(m)
	opts := proto.MarshalOptions{UseCachedSize: true} // Size just ran
	if mem.IsBelowBufferPoolingThreshold(size) {
		b, err := opts.Marshal(m)
		if err != nil {
			return nil, err
		}
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	buf := Pool.Get(size)
	if _, err := opts.MarshalAppend((*buf)[:0], m); err != nil {
		Pool.Put(buf)
		return nil, err
	}
	return mem.BufferSlice{mem.NewBuffer(buf, Pool)}, nil
}

// Unmarshal decodes data into v. proto.Unmarshal copies what it keeps, so
// the buffer goes back to the pool at once.
func (Codec) Unmarshal(data mem.BufferSlice, v any) error {
	return unmarshal(data, v)
}

func unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("wire: unmarshal into %T: not a proto.Message", v)
	}
	buf := data.MaterializeToBuffer(Pool)
	defer buf.Free()
	return proto.Unmarshal(buf.ReadOnlyData(), m)
}

// ServerCodec is Codec for a server that answers a request which does not
// decode with INVALID_ARGUMENT: gRPC reports any Unmarshal error to the
// client as INTERNAL before a handler runs, which tells the client the
// daemon is broken rather than its input. ServerCodec's Unmarshal instead
// records the error, leaves the message empty and succeeds; the server's
// handlers ask DecodeError right after decoding and fail the call.
// Use one value per server (NewServerCodec).
type ServerCodec struct {
	Codec
	errs *sync.Map // proto.Message → error, until DecodeError takes it
}

// NewServerCodec returns a ServerCodec.
func NewServerCodec() ServerCodec { return ServerCodec{errs: new(sync.Map)} }

// Unmarshal decodes data into v, recording a decoding error for
// DecodeError instead of returning it.
func (c ServerCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if err := unmarshal(data, v); err != nil {
		if m, ok := v.(proto.Message); ok {
			proto.Reset(m)
			c.errs.Store(m, err)
			return nil
		}
		return err
	}
	return nil
}

// DecodeError returns, and forgets, the error recorded when v was
// decoded (nil when it decoded).
func (c ServerCodec) DecodeError(v any) error {
	if err, ok := c.errs.LoadAndDelete(v); ok {
		return err.(error)
	}
	return nil
}
