package events

import (
	"encoding/hex"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kvtier/kvtier/offload"
)

// want is what Decode should return for the events of a golden case: the
// hashes as vLLM's integer form, the medium and the group.
func (c *goldenCase) decoded(t *testing.T, positional bool) []Decoded {
	t.Helper()
	var out []Decoded
	for _, ev := range c.blockEvents(t) {
		d := Decoded{Type: ev.Type, Medium: ev.Medium, Group: ev.GroupIdx, Hashes: []uint64{}}
		if !positional {
			d.Locality = ev.Locality
		}
		for _, h := range ev.BlockHashes {
			d.Hashes = append(d.Hashes, offload.WireHash(h))
		}
		out = append(out, d)
	}
	return out
}

// The decoder reads every batch vLLM's own encoder wrote (both releases'
// forms, both hash encodings) as the events it describes.
func TestDecodeVLLMGoldenBatches(t *testing.T) {
	golden := readGolden(t)
	var d Decoder
	for _, c := range golden.Cases {
		for name, h := range map[string]string{"map_int": c.MapInt, "map_raw": c.MapRaw, "array_int": c.ArrayInt, "array_raw": c.ArrayRaw} {
			want := c.decoded(t, strings.HasPrefix(name, "array"))
			b, err := hex.DecodeString(h)
			if err != nil {
				t.Fatal(err)
			}
			got, err := d.Decode(b)
			if err != nil {
				t.Fatalf("%s, %s: %v", c.Name, name, err)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("%s, %s (-want +got):\n%s", c.Name, name, diff)
			}
		}
	}
}

// What the Tracker and Format write decodes back to its keys.
func TestDecodeRoundTrip(t *testing.T) {
	k1 := offload.MakeKey([]byte("0123456789abcdef"), 0)
	k2 := offload.MakeKey([]byte("fedcba9876543210"), 3)
	evs := []BlockEvent{
		{Type: BlockStored, BlockHashes: []string{k1.Hash()}, Medium: MediumCPU, HasGroupIdx: true},
		{Type: BlockStored, BlockHashes: []string{k2.Hash()}, Medium: MediumStorage, GroupIdx: 3, HasGroupIdx: true, Locality: LocalityLocal},
		{Type: BlockRemoved, BlockHashes: []string{k1.Hash(), k2.Hash()}, Medium: MediumCPU, HasGroupIdx: true},
		{Type: AllBlocksCleared},
	}
	want := []Decoded{
		{Type: BlockStored, Hashes: []uint64{k1.WireHash()}, Medium: MediumCPU},
		{Type: BlockStored, Hashes: []uint64{k2.WireHash()}, Medium: MediumStorage, Locality: LocalityLocal, Group: 3},
		{Type: BlockRemoved, Hashes: []uint64{k1.WireHash(), k2.WireHash()}, Medium: MediumCPU},
		{Type: AllBlocksCleared, Hashes: []uint64{}},
	}
	var d Decoder
	for _, f := range []Format{{}, {RawHashes: true}, {Positional: true}, {Positional: true, RawHashes: true}} {
		got, err := d.Decode(f.AppendBatch(nil, 1.5, evs, 0))
		if err != nil {
			t.Fatalf("%+v: %v", f, err)
		}
		want[1].Locality = LocalityLocal
		if f.Positional {
			want[1].Locality = "" // vLLM 0.23's schema has no locality
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%+v (-want +got):\n%s", f, diff)
		}
	}
}

func TestDecodeRejects(t *testing.T) {
	var d Decoder
	for name, b := range map[string][]byte{
		"empty":        nil,
		"not an array": {0xc0},
		"short batch":  {0x91, 0x00},
		"bad event":    {0x93, 0x00, 0x91, 0x05, 0x00},
		"no type":      {0x93, 0x00, 0x91, 0x80, 0x00},
		"unknown type": append([]byte{0x93, 0x00, 0x91, 0x91, 0xa3}, "Foo"...),
		"truncated":    {0x93, 0x00, 0x92, 0x91},
	} {
		if _, err := d.Decode(b); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
}

// FuzzDecode: any payload decodes or fails with an error, never panics,
// and what decodes has a known type.
func FuzzDecode(f *testing.F) {
	golden := readGolden(f)
	for _, c := range golden.Cases {
		for _, h := range []string{c.MapInt, c.MapRaw, c.ArrayInt, c.ArrayRaw} {
			b, _ := hex.DecodeString(h)
			f.Add(b)
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var d Decoder
		evs, err := d.Decode(b)
		if err != nil {
			return
		}
		for _, ev := range evs {
			if ev.Type > AllBlocksCleared {
				t.Fatalf("type %d", ev.Type)
			}
		}
	})
}
