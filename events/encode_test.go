package events

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvtier/kvtier/offload"
)

// unhex turns a commented hex listing into bytes: everything after '#' on a
// line is ignored, as is white space.
func unhex(t *testing.T, listing string) []byte {
	t.Helper()
	var sb strings.Builder
	for line := range strings.SplitSeq(listing, "\n") {
		line, _, _ = strings.Cut(line, "#")
		sb.WriteString(strings.Join(strings.Fields(line), ""))
	}
	b, err := hex.DecodeString(sb.String())
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The example of docs/semantics.md §6.4, byte by byte, as vLLM's msgspec encoder writes
// it (testdata/vllm_golden.json has the same batch). Python's msgpack.packb
// of the same value would write a fixmap header: msgspec sizes the header
// for every field BlockStored has.
const goldenSpecExample = `
93                                   # batch: array of 3
cb 41daa8dbe0351eb8                  # ts 1789095808.83 as float64
91                                   # events: array of 1
de 0009                              # map16 of 9
a4 74797065                          # "type"
ab 426c6f636b53746f726564            # "BlockStored"
ac 626c6f636b5f686173686573          # "block_hashes"
91 cf dab89baa7b5857c0               # [15760518052499183552] as uint64
b1 706172656e745f626c6f636b5f68617368  # "parent_block_hash"
c0                                   # nil
a9 746f6b656e5f696473                # "token_ids"
90                                   # []
aa 626c6f636b5f73697a65              # "block_size"
00                                   # 0
a7 6c6f72615f6964                    # "lora_id"
c0                                   # nil
a6 6d656469756d                      # "medium"
a3 435055                            # "CPU"
a9 6c6f72615f6e616d65                # "lora_name"
c0                                   # nil
a9 67726f75705f696478                # "group_idx"
00                                   # 0 (kept: the default is nil, not 0)
00                                   # dp_rank 0
`

func specExampleKey() offload.Key {
	// A 32-byte hash whose last 8 bytes are 0xdab89baa7b5857c0.
	raw := bytes.Repeat([]byte{0x11}, 24)
	raw = append(raw, 0xda, 0xb8, 0x9b, 0xaa, 0x7b, 0x58, 0x57, 0xc0)
	return offload.MakeKey(raw, 0)
}

func TestGoldenSpecExample(t *testing.T) {
	tr := mustTracker(t, TrackerConfig{})
	var b Batch
	tr.Translate(&b, []offload.Event{{Keys: []offload.Key{specExampleKey()}, Medium: offload.MediumCPU}})
	got := Format{}.AppendBatch(nil, 1789095808.83, b.Events, 0)
	if want := unhex(t, goldenSpecExample); !bytes.Equal(got, want) {
		t.Fatalf("encoding differs from the spec example:\n got %x\nwant %x", got, want)
	}
}

const goldenRemovedLocality = `
93 cb 41d0000000000000               # [ts 1073741824.0,
92                                   #  events: array of 2
85                                   #  map of 5
a4 74797065 ac 426c6f636b52656d6f766564                 # type: "BlockRemoved"
ac 626c6f636b5f686173686573 92 01 cc ff                 # block_hashes: [1, 255]
a6 6d656469756d a7 53544f52414745                       # medium: "STORAGE"
a9 67726f75705f696478 02                                # group_idx: 2
a8 6c6f63616c697479 a5 4c4f43414c                       # locality: "LOCAL"
81 a4 74797065 b0 416c6c426c6f636b73436c6561726564      #  {type: "AllBlocksCleared"}
07                                   # dp_rank 7]
`

func TestGoldenRemovedAndCleared(t *testing.T) {
	evs := []BlockEvent{
		{Type: BlockRemoved, BlockHashes: hs(1, 255), Medium: "STORAGE", GroupIdx: 2, HasGroupIdx: true, Locality: "LOCAL"},
		{Type: AllBlocksCleared},
	}
	got := Format{}.AppendBatch(nil, 1<<30, evs, 7)
	if want := unhex(t, goldenRemovedLocality); !bytes.Equal(got, want) {
		t.Fatalf("got  %x\nwant %x", got, want)
	}
}

func TestGoldenPositionalRawHashes(t *testing.T) {
	evs := []BlockEvent{
		{Type: BlockStored, BlockHashes: []string{"\x05"}, Medium: "CPU", HasGroupIdx: true},
		{Type: BlockRemoved, BlockHashes: hs(6), GroupIdx: 1, HasGroupIdx: true},
	}
	got := Format{Positional: true, RawHashes: true}.AppendBatch(nil, 1<<30, evs, 0)
	want := unhex(t, `
93 cb 41d0000000000000 92
9c ab 426c6f636b53746f726564       # ["BlockStored",
91 c4 01 05                        #  [bin 05],
c0 90 00 c0 a3 435055 c0           #  nil, [], 0, nil, "CPU", nil,
c0 00 c0 c0                        #  extra_keys nil, group_idx 0, kind nil, window nil]
94 ac 426c6f636b52656d6f766564     # ["BlockRemoved",
91 c4 08 0000000000000006          #  [bin 8 bytes],
c0 01                              #  medium nil, group_idx 1]
00`)
	if !bytes.Equal(got, want) {
		t.Fatalf("got  %x\nwant %x", got, want)
	}
}

// The shapes of llm-d-kv-cache with map-event support (its PR #661): the
// batch is a positional array whose events stay raw until the tag is
// known, events are decoded as maps; hashes may be uint64 or bytes.
// llm-d main (7be76e1) decodes events positionally instead, see
// decodeLLMDMain.
type llmdBatch struct {
	_                struct{} `msgpack:",array"`
	TS               float64
	Events           []msgpack.RawMessage
	DataParallelRank *int `msgpack:",omitempty"`
}

type llmdStored struct {
	Type            string   `msgpack:"type"`
	BlockHashes     []any    `msgpack:"block_hashes"`
	ParentBlockHash any      `msgpack:"parent_block_hash"`
	TokenIDs        []uint32 `msgpack:"token_ids"`
	BlockSize       int      `msgpack:"block_size"`
	LoraID          *int     `msgpack:"lora_id"`
	Medium          *string  `msgpack:"medium"`
	LoraName        *string  `msgpack:"lora_name"`
	GroupIdx        *int     `msgpack:"group_idx"`
	SpecKind        *string  `msgpack:"kv_cache_spec_kind"`
	Locality        *string  `msgpack:"locality"`
}

type llmdRemoved struct {
	Type        string  `msgpack:"type"`
	BlockHashes []any   `msgpack:"block_hashes"`
	Medium      *string `msgpack:"medium"`
	GroupIdx    *int    `msgpack:"group_idx"`
	Locality    *string `msgpack:"locality"`
}

// decodeLLMD decodes payload the way llm-d does and returns the batch and
// its events (as *llmdStored / *llmdRemoved / the tag string).
func decodeLLMD(t testing.TB, payload []byte) (llmdBatch, []any) {
	t.Helper()
	var b llmdBatch
	if err := msgpack.Unmarshal(payload, &b); err != nil {
		t.Fatalf("decode batch: %v", err)
	}
	var out []any
	for _, raw := range b.Events {
		var tag struct {
			Type string `msgpack:"type"`
		}
		if err := msgpack.Unmarshal(raw, &tag); err != nil {
			t.Fatalf("decode tag: %v", err)
		}
		switch tag.Type {
		case "BlockStored":
			var ev llmdStored
			if err := msgpack.Unmarshal(raw, &ev); err != nil {
				t.Fatalf("decode BlockStored: %v", err)
			}
			out = append(out, &ev)
		case "BlockRemoved":
			var ev llmdRemoved
			if err := msgpack.Unmarshal(raw, &ev); err != nil {
				t.Fatalf("decode BlockRemoved: %v", err)
			}
			out = append(out, &ev)
		default:
			out = append(out, tag.Type)
		}
	}
	return b, out
}

// decodeLLMDMain decodes payload the way llm-d-kv-cache main (7be76e1,
// pkg/kvevents/engineadapter) does: each event is decoded as an array of
// values, the tag first, fields by position with a length guard, so that
// an event in map form is an error. It returns the same shapes as
// decodeLLMD (without locality, which the array schema does not have).
func decodeLLMDMain(payload []byte) (llmdBatch, []any, error) {
	var b llmdBatch
	if err := msgpack.Unmarshal(payload, &b); err != nil {
		return b, nil, fmt.Errorf("decode batch: %w", err)
	}
	var out []any
	for _, raw := range b.Events {
		var f []any
		if err := msgpack.Unmarshal(raw, &f); err != nil {
			return b, nil, fmt.Errorf("decode event: %w", err)
		}
		at := func(i int) any {
			if i < len(f) {
				return f[i]
			}
			return nil
		}
		str := func(i int) *string {
			if s, ok := at(i).(string); ok {
				return &s
			}
			return nil
		}
		num := func(i int) *int {
			if at(i) == nil {
				return nil
			}
			n := int(normaliseOne(at(i)).(uint64))
			return &n
		}
		tag, _ := at(0).(string)
		switch tag {
		case "BlockStored":
			if len(f) < 5 {
				return b, nil, fmt.Errorf("BlockStored: %d fields", len(f))
			}
			ev := &llmdStored{Type: tag, ParentBlockHash: at(2), BlockSize: *num(4), LoraID: num(5),
				Medium: str(6), LoraName: str(7), GroupIdx: num(9), SpecKind: str(10)}
			ev.BlockHashes, _ = at(1).([]any)
			toks, _ := at(3).([]any)
			for _, t := range toks {
				ev.TokenIDs = append(ev.TokenIDs, uint32(normaliseOne(t).(uint64)))
			}
			out = append(out, ev)
		case "BlockRemoved":
			if len(f) < 2 {
				return b, nil, fmt.Errorf("BlockRemoved: %d fields", len(f))
			}
			ev := &llmdRemoved{Type: tag, Medium: str(2), GroupIdx: num(3)}
			ev.BlockHashes, _ = at(1).([]any)
			out = append(out, ev)
		case "AllBlocksCleared":
			out = append(out, tag)
		default:
			return b, nil, fmt.Errorf("unknown event tag %q", tag)
		}
	}
	return b, out, nil
}

func ptr[T any](v T) *T { return &v }

func TestDecodeWithVmihailenco(t *testing.T) {
	tr := mustTracker(t, TrackerConfig{SelfDescribing: true})
	k, m := chunkMeta(1, 1, 4)
	m.LoraID, m.LoraName = 3, "sql"
	mustRecord(t, tr, k, m)
	var b Batch
	tr.Translate(&b, []offload.Event{
		{Keys: []offload.Key{k}, Medium: offload.MediumCPU},
		{Keys: []offload.Key{k, chunkKey(9, 1)}, Medium: offload.MediumStorage, Locality: offload.LocalityRemote, Removed: true},
	})
	payload := Format{}.AppendBatch(nil, 12.5, b.Events, 1)
	batch, evs := decodeLLMD(t, payload)
	if batch.TS != 12.5 || batch.DataParallelRank == nil || *batch.DataParallelRank != 1 {
		t.Errorf("batch ts %v rank %v", batch.TS, batch.DataParallelRank)
	}
	want := []any{
		&llmdStored{Type: "BlockStored", BlockHashes: []any{uint64(1001)}, ParentBlockHash: uint64(1000),
			TokenIDs: []uint32{5, 6, 7, 8}, BlockSize: 4, LoraID: ptr(3), Medium: ptr("CPU"), LoraName: ptr("sql"),
			GroupIdx: ptr(0), SpecKind: ptr("full_attention")},
		&llmdRemoved{Type: "BlockRemoved", BlockHashes: []any{uint64(1001)}, Medium: ptr("STORAGE"), GroupIdx: ptr(0), Locality: ptr("REMOTE")},
		&llmdRemoved{Type: "BlockRemoved", BlockHashes: []any{uint64(9)}, Medium: ptr("STORAGE"), GroupIdx: ptr(1), Locality: ptr("REMOTE")},
	}
	// vmihailenco decodes small unsigned integers into `any` as the
	// narrowest Go type; normalise to uint64 like llm-d's getHashAsUint64.
	for _, ev := range evs {
		switch e := ev.(type) {
		case *llmdStored:
			normalise(e.BlockHashes)
			e.ParentBlockHash = normaliseOne(e.ParentBlockHash)
		case *llmdRemoved:
			normalise(e.BlockHashes)
		}
	}
	if d := cmp.Diff(want, evs); d != "" {
		t.Errorf("decoded (-want +got):\n%s", d)
	}
}

func normalise(xs []any) {
	for i := range xs {
		xs[i] = normaliseOne(xs[i])
	}
}

func normaliseOne(x any) any {
	switch v := x.(type) {
	case int8:
		return uint64(v)
	case int16:
		return uint64(v)
	case int32:
		return uint64(v)
	case int64:
		return uint64(v)
	case uint8:
		return uint64(v)
	case uint16:
		return uint64(v)
	case uint32:
		return uint64(v)
	}
	return x
}

func TestEncodeDoesNotAllocate(t *testing.T) {
	tr := mustTracker(t, TrackerConfig{SelfDescribing: true})
	var evs []offload.Event
	for i := range 32 {
		k, m := chunkMeta(i, 1, 16)
		if i%2 == 0 {
			mustRecord(t, tr, k, m)
		}
		evs = append(evs, offload.Event{Keys: []offload.Key{k}, Medium: offload.MediumCPU})
	}
	evs = append(evs, offload.Event{Keys: []offload.Key{chunkKey(1, 0), chunkKey(2, 1)}, Medium: offload.MediumStorage, Removed: true})
	var b Batch
	var buf []byte
	run := func() {
		b.Reset()
		tr.Translate(&b, evs)
		buf = Format{}.AppendBatch(buf[:0], 1, b.Events, 0)
	}
	run() // grow buffers
	if n := testing.AllocsPerRun(100, run); n != 0 {
		t.Errorf("translate+encode allocates %v times per batch, want 0", n)
	}
}
