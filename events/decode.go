package events

import (
	"errors"
	"fmt"

	"github.com/tinylib/msgp/msgp"

	"github.com/kvtier/kvtier/offload"
)

// ErrMalformed reports a batch payload that is not a vLLM event batch.
var ErrMalformed = errors.New("malformed KV event batch")

// Decoded is one event of a decoded batch, the part an index of what a
// publisher holds needs: which blocks, in which medium and KV group.
// Hashes are the wire hashes (offload.WireHash of raw hash bytes).
type Decoded struct {
	Type   EventType
	Hashes []uint64
	// Medium is the medium's wire name ("" when nil); Locality the
	// locality's ("" when absent: the engine's or kvtier's primary, or
	// vLLM ≤ 0.23's positional form, which has no locality).
	Medium, Locality string
	Group            uint32
}

// Decoder decodes the payload frame of published batches, in both forms
// (map-encoded events and vLLM ≤ 0.23's arrays) and with both hash
// encodings (integers and raw bytes). It reuses its buffers: what Decode
// returns is valid until the next call. Unknown fields are skipped, so
// batches of newer vLLM releases decode too.
type Decoder struct {
	evs    []Decoded
	hashes []uint64
	spans  [][2]int          // each event's hashes in hashes
	medium map[string]string // interned medium and locality names
}

// Limits of one batch, far above what a publisher sends, so that a
// hostile payload cannot make the decoder allocate without bound.
const (
	maxDecodeEvents = 1 << 20
	maxDecodeHashes = 1 << 22
)

// Decode parses one batch payload: [ts, [event, ...], dp_rank].
func (d *Decoder) Decode(b []byte) ([]Decoded, error) {
	d.evs, d.hashes = d.evs[:0], d.hashes[:0]
	n, b, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil || n < 2 {
		return nil, fmt.Errorf("%w: not a [ts, events, dp_rank] array", ErrMalformed)
	}
	if b, err = msgp.Skip(b); err != nil { // ts
		return nil, fmt.Errorf("%w: ts: %v", ErrMalformed, err)
	}
	ne, b, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil || ne > maxDecodeEvents {
		return nil, fmt.Errorf("%w: events: %v", ErrMalformed, err)
	}
	d.spans = d.spans[:0]
	for i := uint32(0); i < ne; i++ {
		var ev Decoded
		start := len(d.hashes)
		if b, err = d.event(b, &ev); err != nil {
			return nil, fmt.Errorf("%w: event %d: %v", ErrMalformed, i, err)
		}
		d.evs = append(d.evs, ev)
		d.spans = append(d.spans, [2]int{start, len(d.hashes)})
	}
	// Hashes point into one buffer that may have moved while it grew.
	for i, sp := range d.spans {
		d.evs[i].Hashes = d.hashes[sp[0]:sp[1]:sp[1]]
	}
	return d.evs, nil
}

func (d *Decoder) event(b []byte, ev *Decoded) ([]byte, error) {
	switch msgp.NextType(b) {
	case msgp.MapType:
		return d.mapEvent(b, ev)
	case msgp.ArrayType:
		return d.arrayEvent(b, ev)
	}
	return b, errors.New("neither a map nor an array")
}

func (d *Decoder) mapEvent(b []byte, ev *Decoded) ([]byte, error) {
	n, b, err := msgp.ReadMapHeaderBytes(b)
	if err != nil {
		return b, err
	}
	typed := false
	for range n {
		var k []byte
		if k, b, err = msgp.ReadStringZC(b); err != nil {
			return b, fmt.Errorf("field name: %v", err)
		}
		switch string(k) {
		case "type":
			if ev.Type, b, err = readType(b); err != nil {
				return b, err
			}
			typed = true
		case "block_hashes":
			b, err = d.readHashes(b)
		case "medium":
			ev.Medium, b, err = d.readMedium(b)
		case "locality":
			ev.Locality, b, err = d.readMedium(b)
		case "group_idx":
			ev.Group, b, err = readOptUint32(b)
		default:
			b, err = msgp.Skip(b)
		}
		if err != nil {
			return b, fmt.Errorf("%s: %v", k, err)
		}
	}
	if !typed {
		return b, errors.New("no type")
	}
	return b, nil
}

// arrayEvent reads the positional form: the tag, then the fields in the
// order of vLLM ≤ 0.23's structs (see appendStoredArray and
// appendRemovedArray).
func (d *Decoder) arrayEvent(b []byte, ev *Decoded) ([]byte, error) {
	n, b, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil || n == 0 {
		return b, errors.New("empty array")
	}
	if ev.Type, b, err = readType(b); err != nil {
		return b, err
	}
	// Field positions after the tag: hashes, then medium and group_idx.
	medium, group := -1, -1
	switch ev.Type {
	case BlockStored:
		medium, group = 6, 9
	case BlockRemoved:
		medium, group = 2, 3
	}
	for i := 1; i < int(n); i++ {
		switch {
		case i == 1 && ev.Type != AllBlocksCleared:
			b, err = d.readHashes(b)
		case i == medium:
			ev.Medium, b, err = d.readMedium(b)
		case i == group:
			ev.Group, b, err = readOptUint32(b)
		default:
			b, err = msgp.Skip(b)
		}
		if err != nil {
			return b, fmt.Errorf("field %d: %v", i, err)
		}
	}
	return b, nil
}

func readType(b []byte) (EventType, []byte, error) {
	s, b, err := msgp.ReadStringZC(b)
	if err != nil {
		return 0, b, fmt.Errorf("type: %v", err)
	}
	switch string(s) {
	case "BlockStored":
		return BlockStored, b, nil
	case "BlockRemoved":
		return BlockRemoved, b, nil
	case "AllBlocksCleared":
		return AllBlocksCleared, b, nil
	}
	return 0, b, fmt.Errorf("unknown event type %q", s)
}

func (d *Decoder) readHashes(b []byte) ([]byte, error) {
	n, b, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil {
		return b, err
	}
	if len(d.hashes)+int(n) > maxDecodeHashes {
		return b, fmt.Errorf("%d hashes in one batch", len(d.hashes)+int(n))
	}
	for range n {
		var h uint64
		switch msgp.NextType(b) {
		case msgp.UintType:
			h, b, err = msgp.ReadUint64Bytes(b)
		case msgp.IntType:
			var v int64
			v, b, err = msgp.ReadInt64Bytes(b)
			h = uint64(v)
		case msgp.BinType:
			var raw []byte
			raw, b, err = msgp.ReadBytesZC(b)
			h = offload.WireHash(string(raw))
		default:
			return b, fmt.Errorf("hash of msgpack type %v", msgp.NextType(b))
		}
		if err != nil {
			return b, err
		}
		d.hashes = append(d.hashes, h)
	}
	return b, nil
}

func (d *Decoder) readMedium(b []byte) (string, []byte, error) {
	if msgp.IsNil(b) {
		b, err := msgp.ReadNilBytes(b)
		return "", b, err
	}
	s, b, err := msgp.ReadStringZC(b)
	if err != nil {
		return "", b, err
	}
	if m, ok := d.medium[string(s)]; ok {
		return m, b, nil
	}
	if d.medium == nil {
		d.medium = make(map[string]string)
	}
	m := string(s)
	if len(d.medium) < 64 {
		d.medium[m] = m
	}
	return m, b, nil
}

func readOptUint32(b []byte) (uint32, []byte, error) {
	if msgp.IsNil(b) {
		b, err := msgp.ReadNilBytes(b)
		return 0, b, err
	}
	return msgp.ReadUint32Bytes(b)
}
