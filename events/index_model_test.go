package events

import (
	"fmt"
	"testing"

	"pgregory.net/rapid"

	"github.com/kvtier/kvtier/offload"
)

// routerIndex indexes wire events the way llm-d's kvblock index does: by
// (block hash, medium); a BlockStored adds each of its hashes, a
// BlockRemoved deletes each of its hashes on that medium.
type routerIndex map[indexKey]struct{}

type indexKey struct {
	hash   uint64
	medium string
}

func (ix routerIndex) apply(evs []BlockEvent) {
	for _, ev := range evs {
		for _, h := range ev.BlockHashes {
			k := indexKey{offload.WireHash(h), ev.Medium}
			switch ev.Type {
			case BlockStored:
				ix[k] = struct{}{}
			case BlockRemoved:
				delete(ix, k)
			}
		}
	}
}

// The tiers of the model, one per medium so that an index keyed by
// (hash, medium) can be compared with the truth exactly.
var modelTiers = []struct {
	tier   string
	medium offload.Medium
	wire   string
}{
	{"", offload.MediumCPU, MediumCPU},
	{"disk", offload.MediumStorage, MediumStorage},
}

// Stores and evictions of self-describing chunks across media, in any
// order and batching, leave a router's index holding exactly the hashes
// announced for the chunks each medium holds, and empty once every medium
// has evicted everything. Removals that lose their hashes after the first
// medium's eviction (issue 17, item 3) break both.
func TestRemovalsAcrossMediaEmptyTheIndex(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		const chunks, perChunk = 6, 3
		tr, err := NewTracker(TrackerConfig{SelfDescribing: true})
		if err != nil {
			rt.Fatal(err)
		}
		keys := make([]offload.Key, chunks)
		metas := make([]TokenMeta, chunks)
		for c := range chunks {
			keys[c], metas[c] = chunkMeta(c, perChunk, 2)
		}
		// The model: which tiers hold each chunk and which hashes their
		// store announced; whether the chunk has metadata and which tiers
		// announced it with that metadata (they keep it alive).
		type op struct {
			tier, chunk int
			removed     bool
		}
		announced := make([]map[int][]string, len(modelTiers)) // [tier][chunk]
		for i := range announced {
			announced[i] = map[int][]string{}
		}
		held := func(ti, c int) bool { _, ok := announced[ti][c]; return ok }
		hasMeta := make([]bool, chunks)
		holders := make([]map[int]bool, chunks)
		for c := range holders {
			holders[c] = map[int]bool{}
		}
		ix := routerIndex{}
		var pending []op
		flush := func() {
			evs := make([]offload.Event, len(pending))
			var removedNow []int
			for i, o := range pending {
				mt := modelTiers[o.tier]
				evs[i] = offload.Event{Keys: []offload.Key{keys[o.chunk]}, Medium: mt.medium, Tier: mt.tier, Removed: o.removed}
				if o.removed {
					delete(announced[o.tier], o.chunk)
					delete(holders[o.chunk], o.tier)
					removedNow = append(removedNow, o.chunk)
					continue
				}
				if hasMeta[o.chunk] {
					holders[o.chunk][o.tier] = true
					announced[o.tier][o.chunk] = hs(1000+uint64(o.chunk*perChunk), 1001+uint64(o.chunk*perChunk), 1002+uint64(o.chunk*perChunk))
				} else {
					announced[o.tier][o.chunk] = []string{keys[o.chunk].Hash()}
				}
			}
			for _, c := range removedNow {
				if len(holders[c]) == 0 {
					hasMeta[c] = false
				}
			}
			pending = pending[:0]
			var b Batch
			tr.Translate(&b, evs)
			ix.apply(b.Events)
			want := routerIndex{}
			for ti, mt := range modelTiers {
				for _, hashes := range announced[ti] {
					for _, h := range hashes {
						want[indexKey{offload.WireHash(h), mt.wire}] = struct{}{}
					}
				}
			}
			if fmt.Sprint(ix) != fmt.Sprint(want) {
				rt.Fatalf("index %v\nwant  %v", ix, want)
			}
		}
		steps := rapid.IntRange(1, 60).Draw(rt, "steps")
		for range steps {
			ti := rapid.IntRange(0, len(modelTiers)-1).Draw(rt, "tier")
			c := rapid.IntRange(0, chunks-1).Draw(rt, "chunk")
			pendingHas := func(removed bool) bool {
				for i := len(pending) - 1; i >= 0; i-- {
					if pending[i].tier == ti && pending[i].chunk == c {
						return pending[i].removed == removed
					}
				}
				return held(ti, c) != removed
			}
			switch {
			case rapid.IntRange(0, 4).Draw(rt, "op") == 0:
				flush()
			case pendingHas(false): // held once the pending batch lands
				pending = append(pending, op{ti, c, true})
			default:
				// The engine attaches metadata when it stores a chunk
				// into the primary; a cascade re-announces what is there.
				if ti == 0 || rapid.Bool().Draw(rt, "record") {
					if _, err := tr.Record(keys[c], metas[c]); err != nil {
						rt.Fatal(err)
					}
					hasMeta[c] = true
				}
				pending = append(pending, op{ti, c, false})
			}
		}
		flush()
		for ti := range modelTiers {
			for c := range chunks {
				if held(ti, c) {
					pending = append(pending, op{ti, c, true})
				}
			}
		}
		flush()
		if len(ix) != 0 || tr.Len() != 0 {
			rt.Fatalf("after evicting everything: index %v, %d keys of metadata", ix, tr.Len())
		}
	})
}
