package peer

import (
	"sync"
	"sync/atomic"
	"testing"

	"pgregory.net/rapid"

	"github.com/kvtier/kvtier/events"
	"github.com/kvtier/kvtier/offload"
)

// The hints agree with a map after any sequence of adds, removes and
// clears, never hold more than their bound, and a tag that was refused
// for the bound is absent.
func TestHintsModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		bound := rapid.IntRange(1, 3000).Draw(t, "bound")
		h := newHints(bound)
		ref := map[uint64]uint64{}
		// Few distinct tags so that entries are revisited, tombstoned and
		// revived; some collide in their home bucket.
		tags := rapid.SliceOfNDistinct(rapid.Uint64(), 1, 4000, rapid.ID).Draw(t, "tags")
		for i := range tags {
			tags[i] = tagOf(tags[i], 0)
		}
		ops := rapid.IntRange(1, 20000).Draw(t, "ops")
		for range ops {
			tag := tags[rapid.IntRange(0, len(tags)-1).Draw(t, "tag")]
			m := uint64(rapid.IntRange(1, 3).Draw(t, "media"))
			switch rapid.IntRange(0, 20).Draw(t, "op") {
			case 0:
				h.clear(m)
				for k, v := range ref {
					if v&^m == 0 {
						delete(ref, k)
					} else {
						ref[k] = v &^ m
					}
				}
			case 1, 2, 3, 4, 5, 6:
				h.remove(tag, m)
				if v := ref[tag] &^ m; v == 0 {
					delete(ref, tag)
				} else {
					ref[tag] = v
				}
			default:
				ok := h.add(tag, m)
				_, had := ref[tag]
				if !ok {
					if had || len(ref) < bound {
						t.Fatalf("add refused with %d of %d held (had %v)", len(ref), bound, had)
					}
					continue
				}
				ref[tag] |= m
			}
			if h.live != len(ref) || h.live > bound {
				t.Fatalf("live %d, model %d, bound %d", h.live, len(ref), bound)
			}
		}
		for _, tag := range tags {
			if got := h.media(tag); got != ref[tag] {
				t.Fatalf("tag %x: media %d, model %d", tag, got, ref[tag])
			}
		}
	})
}

// Readers never block or see a torn entry while the writer grows,
// tombstones and rebuilds the table (run with -race).
func TestHintsConcurrentReaders(t *testing.T) {
	h := newHints(1 << 16)
	var stop atomic.Bool
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Go(func() {
			for i := uint64(r); !stop.Load(); i++ {
				if m := h.media(tagOf(mix(i%50000), 0)); m&^mediaMask != 0 {
					t.Errorf("media %x", m)
					return
				}
			}
		})
	}
	for round := range 3 {
		for i := range uint64(40000) {
			h.add(tagOf(mix(i), 0), onCPU)
		}
		for i := uint64(0); i < 40000; i += 2 {
			h.remove(tagOf(mix(i), 0), onCPU)
		}
		if round == 1 {
			h.clear(onCPU)
		}
	}
	stop.Store(true)
	wg.Wait()
	for i := uint64(1); i < 40000; i += 2 {
		if h.media(tagOf(mix(i), 0)) != onCPU {
			t.Fatalf("tag of %d lost", i)
		}
	}
}

// mix spreads small integers over 64 bits as block hashes are (splitmix64).
func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// The primary's events (CPU, no locality) make DRAM hints, a storage
// tier's make storage hints, and a CPU tier with a locality (a Redis
// tier) makes none: a peer read would not find it in the peer's DRAM.
func TestApplyEventsMedia(t *testing.T) {
	h := newHints(16)
	const a, b, c = 11, 22, 33
	applyEvents(h, []events.Decoded{
		{Type: events.BlockStored, Hashes: []uint64{a}, Medium: events.MediumCPU},
		{Type: events.BlockStored, Hashes: []uint64{9, b}, Medium: events.MediumStorage, Locality: events.LocalityLocal},
		{Type: events.BlockStored, Hashes: []uint64{c}, Medium: events.MediumCPU, Locality: events.LocalityRemote},
		{Type: events.BlockStored, Hashes: []uint64{b}, Medium: events.MediumCPU},
	}, events.MediumCPU)
	for _, tc := range []struct {
		hash uint64
		want uint64
	}{{a, onCPU}, {b, onCPU | onStorage}, {c, 0}, {9, 0}} {
		if got := h.media(tagOf(tc.hash, 0)); got != tc.want {
			t.Errorf("hash %d: media %d, want %d", tc.hash, got, tc.want)
		}
	}
	applyEvents(h, []events.Decoded{{Type: events.BlockRemoved, Hashes: []uint64{b}, Medium: events.MediumCPU}}, events.MediumCPU)
	if got := h.media(tagOf(b, 0)); got != onStorage {
		t.Errorf("after the DRAM copy's removal: media %d", got)
	}
	applyEvents(h, []events.Decoded{{Type: events.AllBlocksCleared}}, events.MediumCPU)
	if h.media(tagOf(a, 0)) != 0 || h.media(tagOf(b, 0)) != 0 {
		t.Error("AllBlocksCleared left hints")
	}
}

// keyTag's two-load form is the tag of the key's wire hash and group, for
// every hash length (the events carry only those).
func TestKeyTagIsTagOfWireHash(t *testing.T) {
	for n := 0; n <= 40; n++ {
		hash := make([]byte, n)
		for i := range hash {
			hash[i] = byte(0x9d * (i + 1))
		}
		for _, g := range []uint32{0, 1, 0xfedcba98} {
			k := offload.MakeKey(hash, g)
			if got, want := keyTag(k), tagOf(k.WireHash(), k.Group()); got != want {
				t.Fatalf("%d-byte hash, group %d: tag %#x, want %#x", n, g, got, want)
			}
		}
	}
}
