// Package wire is the gRPC codec the kvtier daemon and its Go client use:
// protobuf, like gRPC's default, but with buffers from a pool whose size
// classes are powers of two. gRPC's default pool jumps from 32 KiB to
// 1 MiB and clears every buffer it hands out, so a 40 KiB Lookup of 1 000
// keys would clear a megabyte on each side of every call.
package wire

import (
	"fmt"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

// Pool has power-of-two classes from 256 bytes to 64 MiB.
var Pool = func() mem.BufferPool {
	var sizes []int
	for s := 256; s <= 64<<20; s *= 2 {
		sizes = append(sizes, s)
	}
	return mem.NewTieredBufferPool(sizes...)
}()

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
	m, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("wire: unmarshal into %T: not a proto.Message", v)
	}
	buf := data.MaterializeToBuffer(Pool)
	defer buf.Free()
	return proto.Unmarshal(buf.ReadOnlyData(), m)
}
