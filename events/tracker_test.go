package events

import (
	"encoding/binary"
	"errors"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kvtier/kvtier/keyspace"
	"github.com/kvtier/kvtier/offload"
)

// h returns the raw 8-byte hash of hash block n (wire value = n).
func h(n uint64) []byte {
	b := make([]byte, 8)
	binary.BigEndian.PutUint64(b, n)
	return b
}

// chunkKey is the key of a chunk whose last hash block is n.
func chunkKey(n uint64, group uint32) offload.Key { return offload.MakeKey(h(n), group) }

// chunkMeta describes chunk c of a sequence with blocksPerChunk hash blocks
// of blockSize tokens each: hash blocks are numbered from 1000, tokens
// from 1.
func chunkMeta(c, blocksPerChunk, blockSize int) (offload.Key, TokenMeta) {
	var m TokenMeta
	m.BlockSize = blockSize
	first := c * blocksPerChunk
	for b := first; b < first+blocksPerChunk; b++ {
		m.BlockHashes = append(m.BlockHashes, h(uint64(1000+b)))
		for t := 0; t < blockSize; t++ {
			m.TokenIDs = append(m.TokenIDs, uint32(b*blockSize+t+1))
		}
	}
	if first > 0 {
		m.ParentHash = h(uint64(1000 + first - 1))
	}
	return chunkKey(uint64(1000+first+blocksPerChunk-1), 0), m
}

func mustTracker(t *testing.T, cfg TrackerConfig) *Tracker {
	t.Helper()
	tr, err := NewTracker(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

func mustRecord(t *testing.T, tr *Tracker, k offload.Key, m TokenMeta) {
	t.Helper()
	ok, err := tr.Record(k, m)
	if err != nil || !ok {
		t.Fatalf("Record(%s) = %v, %v; want captured", k, ok, err)
	}
}

func translate(tr *Tracker, evs ...offload.Event) []BlockEvent {
	var b Batch
	tr.Translate(&b, evs)
	return slices.Clone(b.Events)
}

func stored(medium offload.Medium, keys ...offload.Key) offload.Event {
	return offload.Event{Keys: keys, Medium: medium}
}

func removed(medium offload.Medium, keys ...offload.Key) offload.Event {
	return offload.Event{Keys: keys, Medium: medium, Removed: true}
}

func hs(ns ...uint64) []string {
	out := make([]string, len(ns))
	for i, n := range ns {
		out[i] = string(h(n))
	}
	return out
}

func toks(from, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(from + i)
	}
	return out
}

func placeholder(medium string, group uint32, hash uint64) BlockEvent {
	return BlockEvent{Type: BlockStored, BlockHashes: hs(hash), Medium: medium, GroupIdx: group, HasGroupIdx: true}
}

func diffEvents(t *testing.T, got, want []BlockEvent) {
	t.Helper()
	if d := cmp.Diff(want, got, cmp.Comparer(func(a, b []uint32) bool { return slices.Equal(a, b) })); d != "" {
		t.Errorf("events (-want +got):\n%s", d)
	}
}

// Cases 53–62 (docs/semantics.md §7.E).
func TestTranslateCases(t *testing.T) {
	sd := TrackerConfig{SelfDescribing: true}
	tests := []struct {
		name string
		run  func(t *testing.T)
	}{
		{"53 locality forwarded", func(t *testing.T) {
			tr := mustTracker(t, sd)
			rich, m := chunkMeta(0, 1, 4)
			mustRecord(t, tr, rich, m)
			plain := chunkKey(7, 0)
			got := translate(tr,
				offload.Event{Keys: []offload.Key{rich}, Medium: offload.MediumStorage, Locality: offload.LocalityLocal},
				offload.Event{Keys: []offload.Key{plain}, Medium: offload.MediumStorage, Locality: offload.LocalityRemote},
				offload.Event{Keys: []offload.Key{rich}, Medium: offload.MediumStorage, Locality: offload.LocalityLocal, Removed: true},
			)
			diffEvents(t, got, []BlockEvent{
				{Type: BlockStored, BlockHashes: hs(1000), TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 4, Medium: "STORAGE",
					HasGroupIdx: true, SpecKind: SpecKindFullAttention, Locality: "LOCAL"},
				{Type: BlockStored, BlockHashes: hs(7), Medium: "STORAGE", HasGroupIdx: true, Locality: "REMOTE"},
				{Type: BlockRemoved, BlockHashes: hs(1000), Medium: "STORAGE", HasGroupIdx: true, Locality: "LOCAL"},
			})
		}},
		{"54 routable stores", func(t *testing.T) {
			tr := mustTracker(t, sd)
			var keys []offload.Key
			for c := range 6 {
				k, m := chunkMeta(c, 1, 4)
				mustRecord(t, tr, k, m)
				keys = append(keys, k)
			}
			first := translate(tr, stored(offload.MediumCPU, keys[:3]...))
			second := translate(tr, stored(offload.MediumCPU, keys[3:]...))
			all := append(first, second...)
			if len(first) != 3 || len(second) != 3 {
				t.Fatalf("got %d+%d events, want 3+3", len(first), len(second))
			}
			for i, ev := range all {
				want := BlockEvent{Type: BlockStored, BlockHashes: hs(uint64(1000 + i)), TokenIDs: toks(4*i+1, 4),
					BlockSize: 4, Medium: "CPU", HasGroupIdx: true, SpecKind: SpecKindFullAttention}
				if i > 0 {
					want.ParentHash = string(h(uint64(1000 + i - 1)))
				}
				diffEvents(t, []BlockEvent{ev}, []BlockEvent{want})
			}
			if second[0].ParentHash != first[2].BlockHashes[0] {
				t.Errorf("second batch's first parent %x, want first batch's last hash %x", second[0].ParentHash, first[2].BlockHashes[0])
			}
			if n := tr.Len(); n != 6 {
				t.Errorf("metadata for %d keys, want 6", n)
			}
		}},
		{"55 two blocks per chunk, removal in one event", func(t *testing.T) {
			tr := mustTracker(t, sd)
			k0, m0 := chunkMeta(0, 2, 4)
			k1, m1 := chunkMeta(1, 2, 4)
			mustRecord(t, tr, k0, m0)
			mustRecord(t, tr, k1, m1)
			got := translate(tr, stored(offload.MediumCPU, k0, k1), removed(offload.MediumCPU, k0, k1))
			diffEvents(t, got, []BlockEvent{
				{Type: BlockStored, BlockHashes: hs(1000, 1001), TokenIDs: toks(1, 8), BlockSize: 4, Medium: "CPU",
					HasGroupIdx: true, SpecKind: SpecKindFullAttention},
				{Type: BlockStored, BlockHashes: hs(1002, 1003), ParentHash: string(h(1001)), TokenIDs: toks(9, 8), BlockSize: 4,
					Medium: "CPU", HasGroupIdx: true, SpecKind: SpecKindFullAttention},
				{Type: BlockRemoved, BlockHashes: hs(1000, 1001, 1002, 1003), Medium: "CPU", HasGroupIdx: true},
			})
			if n := tr.Len(); n != 0 {
				t.Errorf("metadata for %d keys after removal, want 0", n)
			}
		}},
		{"56 order independence", func(t *testing.T) {
			tr := mustTracker(t, sd)
			k0, m0 := chunkMeta(0, 3, 4)
			k1, m1 := chunkMeta(1, 3, 4)
			mustRecord(t, tr, k0, m0)
			mustRecord(t, tr, k1, m1)
			unknown := chunkKey(99, 0)
			got := translate(tr, stored(offload.MediumCPU, k1, unknown, k0))
			diffEvents(t, got, []BlockEvent{
				{Type: BlockStored, BlockHashes: hs(1003, 1004, 1005), ParentHash: string(h(1002)), TokenIDs: toks(13, 12),
					BlockSize: 4, Medium: "CPU", HasGroupIdx: true, SpecKind: SpecKindFullAttention},
				placeholder("CPU", 0, 99),
				{Type: BlockStored, BlockHashes: hs(1000, 1001, 1002), TokenIDs: toks(1, 12), BlockSize: 4, Medium: "CPU",
					HasGroupIdx: true, SpecKind: SpecKindFullAttention},
			})
			rm := translate(tr, removed(offload.MediumCPU, k0, k1))
			diffEvents(t, rm, []BlockEvent{{Type: BlockRemoved, BlockHashes: hs(1000, 1001, 1002, 1003, 1004, 1005), Medium: "CPU", HasGroupIdx: true}})
		}},
		{"57 opt-out", func(t *testing.T) {
			tr := mustTracker(t, TrackerConfig{})
			var keys []offload.Key
			for c := range 3 {
				k, m := chunkMeta(c, 1, 4)
				ok, err := tr.Record(k, m)
				if ok || err != nil {
					t.Fatalf("Record with self-describing off = %v, %v; want false, nil", ok, err)
				}
				keys = append(keys, k)
			}
			got := translate(tr, stored(offload.MediumCPU, keys...), removed(offload.MediumCPU, keys...))
			diffEvents(t, got, []BlockEvent{
				placeholder("CPU", 0, 1000), placeholder("CPU", 0, 1001), placeholder("CPU", 0, 1002),
				{Type: BlockRemoved, BlockHashes: hs(1000, 1001, 1002), Medium: "CPU", HasGroupIdx: true},
			})
			if tr.Len() != 0 {
				t.Errorf("metadata captured with self-describing off")
			}
		}},
		{"58 sliding window group", func(t *testing.T) {
			tr := mustTracker(t, sd)
			k, m := chunkMeta(0, 1, 4)
			m.SpecKind = "sliding_window"
			m.SlidingWindow = 128
			if ok, err := tr.Record(k, m); ok || err != nil {
				t.Fatalf("Record(sliding window) = %v, %v; want false, nil", ok, err)
			}
			m.SpecKind = ""
			if ok, _ := tr.Record(k, m); ok {
				t.Fatal("Record with a window captured")
			}
			diffEvents(t, translate(tr, stored(offload.MediumCPU, k)), []BlockEvent{placeholder("CPU", 0, 1000)})
		}},
		{"59 removal grouped by KV group", func(t *testing.T) {
			tr := mustTracker(t, sd)
			got := translate(tr, removed(offload.MediumCPU, chunkKey(1, 0), chunkKey(2, 1), chunkKey(3, 0), chunkKey(4, 1)))
			diffEvents(t, got, []BlockEvent{
				{Type: BlockRemoved, BlockHashes: hs(1, 3), Medium: "CPU", HasGroupIdx: true},
				{Type: BlockRemoved, BlockHashes: hs(2, 4), Medium: "CPU", GroupIdx: 1, HasGroupIdx: true},
			})
		}},
		{"60 restore after eviction", func(t *testing.T) {
			tr := mustTracker(t, sd)
			k, m := chunkMeta(0, 1, 4)
			mustRecord(t, tr, k, m)
			translate(tr, stored(offload.MediumCPU, k), removed(offload.MediumCPU, k))
			if tr.Has(k) {
				t.Fatal("metadata kept after removal")
			}
			m.TokenIDs = []uint32{41, 42, 43, 44}
			mustRecord(t, tr, k, m)
			got := translate(tr, stored(offload.MediumCPU, k))
			if len(got) != 1 || !slices.Equal(got[0].TokenIDs, m.TokenIDs) {
				t.Fatalf("restored event %+v, want tokens %v", got, m.TokenIDs)
			}
		}},
		{"61 reset clears the side table", func(t *testing.T) {
			tr := mustTracker(t, sd)
			k, m := chunkMeta(0, 1, 4)
			mustRecord(t, tr, k, m)
			tr.Reset()
			if tr.Len() != 0 || tr.Has(k) {
				t.Fatal("metadata survived Reset")
			}
			diffEvents(t, translate(tr, stored(offload.MediumCPU, k)), []BlockEvent{placeholder("CPU", 0, 1000)})
		}},
		{"62 medium strings", func(t *testing.T) {
			tr := mustTracker(t, TrackerConfig{})
			got := translate(tr, stored(offload.MediumCPU, chunkKey(1, 0)), stored(offload.MediumStorage, chunkKey(2, 0)),
				stored(offload.MediumUnspecified, chunkKey(3, 0)))
			diffEvents(t, got, []BlockEvent{placeholder("CPU", 0, 1), placeholder("STORAGE", 0, 2), placeholder("", 0, 3)})
			renamed := mustTracker(t, TrackerConfig{MediumNames: map[string]string{"STORAGE": "DISK"}})
			got = translate(renamed, stored(offload.MediumCPU, chunkKey(1, 0)), removed(offload.MediumStorage, chunkKey(2, 0)))
			diffEvents(t, got, []BlockEvent{placeholder("CPU", 0, 1),
				{Type: BlockRemoved, BlockHashes: hs(2), Medium: "DISK", HasGroupIdx: true}})
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, tc.run)
	}
}

func TestTrackerConfigErrors(t *testing.T) {
	for _, names := range []map[string]string{{"GPU": "X"}, {"cpu": "X"}, {"CPU": ""}} {
		if _, err := NewTracker(TrackerConfig{MediumNames: names}); err == nil {
			t.Errorf("NewTracker(MediumNames=%v) succeeded, want error", names)
		}
	}
}

func TestRecordRejectsInvalidMeta(t *testing.T) {
	tr := mustTracker(t, TrackerConfig{SelfDescribing: true})
	k, good := chunkMeta(1, 2, 4)
	mutate := map[string]func(m *TokenMeta){
		"no hashes":        func(m *TokenMeta) { m.BlockHashes = nil; m.TokenIDs = nil },
		"zero block size":  func(m *TokenMeta) { m.BlockSize = 0 },
		"token count":      func(m *TokenMeta) { m.TokenIDs = m.TokenIDs[1:] },
		"empty hash":       func(m *TokenMeta) { m.BlockHashes = [][]byte{{}, m.BlockHashes[1]} },
		"last hash is not": func(m *TokenMeta) { m.BlockHashes = [][]byte{m.BlockHashes[1], m.BlockHashes[0]} },
		"negative lora":    func(m *TokenMeta) { m.LoraID = -1 },
	}
	for name, f := range mutate {
		m := good
		m.BlockHashes = slices.Clone(good.BlockHashes)
		f(&m)
		if ok, err := tr.Record(k, m); ok || !errors.Is(err, ErrInvalidMeta) {
			t.Errorf("%s: Record = %v, %v; want ErrInvalidMeta", name, ok, err)
		}
	}
	if _, err := tr.Record("abc", good); !errors.Is(err, offload.ErrInvalidKey) {
		t.Errorf("Record(short key) error %v, want ErrInvalidKey", err)
	}
	if tr.Len() != 0 {
		t.Errorf("invalid metadata was stored")
	}
}

func TestRecordBoundedAndCopied(t *testing.T) {
	tr := mustTracker(t, TrackerConfig{SelfDescribing: true, MaxEntries: 2})
	k0, m0 := chunkMeta(0, 1, 4)
	k1, m1 := chunkMeta(1, 1, 4)
	k2, m2 := chunkMeta(2, 1, 4)
	mustRecord(t, tr, k0, m0)
	mustRecord(t, tr, k1, m1)
	mustRecord(t, tr, k0, m0) // re-recording makes k0 the newest
	mustRecord(t, tr, k2, m2) // evicts the oldest: k1
	if tr.Has(k1) || !tr.Has(k0) || !tr.Has(k2) || tr.Len() != 2 || tr.Evicted() != 1 {
		t.Fatalf("after eviction: k0 %v k1 %v k2 %v len %d evicted %d; want k1 evicted",
			tr.Has(k0), tr.Has(k1), tr.Has(k2), tr.Len(), tr.Evicted())
	}
	m0.TokenIDs[0] = 777 // the caller's buffers are not retained
	got := translate(tr, stored(offload.MediumCPU, k0))
	if got[0].TokenIDs[0] != 1 {
		t.Errorf("tracker shares the caller's token slice")
	}
}

// The eviction queue stays proportional to the live entries however many
// keys come and go.
func TestRecordQueueCompacts(t *testing.T) {
	tr := mustTracker(t, TrackerConfig{SelfDescribing: true, MaxEntries: 100})
	for i := range 20000 {
		k, m := chunkMeta(i, 1, 1)
		mustRecord(t, tr, k, m)
		if i%2 == 0 {
			translate(tr, removed(offload.MediumCPU, k))
		}
	}
	if tr.Len() != 100 {
		t.Errorf("len %d, want 100", tr.Len())
	}
	if n := len(tr.fifo); n > 2*tr.Len()+1024 {
		t.Errorf("eviction queue holds %d entries for %d live keys", n, tr.Len())
	}
}

func TestOwnership(t *testing.T) {
	tr := mustTracker(t, TrackerConfig{Ownership: true})
	got := translate(tr,
		offload.Event{Keys: []offload.Key{chunkKey(1, 0)}, Medium: offload.MediumStorage, Tier: "fs0"},
		offload.Event{Keys: []offload.Key{chunkKey(2, 0)}, Medium: offload.MediumCPU})
	if got[0].Ownership != "fs0" || got[1].Ownership != "" {
		t.Errorf("ownership %q, %q; want fs0 and none", got[0].Ownership, got[1].Ownership)
	}
	off := translate(mustTracker(t, TrackerConfig{}), offload.Event{Keys: []offload.Key{chunkKey(1, 0)}, Tier: "fs0"})
	if off[0].Ownership != "" {
		t.Errorf("ownership written while disabled")
	}
}

func TestTranslateSkipsEmptyEvents(t *testing.T) {
	tr := mustTracker(t, TrackerConfig{})
	if got := translate(tr, stored(offload.MediumCPU), removed(offload.MediumCPU)); len(got) != 0 {
		t.Errorf("events without keys produced %d wire events", len(got))
	}
}

// The side table is bounded in bytes as well as entries: an API client
// that attaches the largest metadata allowed to every key cannot grow it
// to MaxEntries × MaxMetaTokens.
func TestRecordBoundedInBytes(t *testing.T) {
	tr := mustTracker(t, TrackerConfig{SelfDescribing: true, MaxBytes: 64 << 10})
	for i := range 20 {
		k, m := chunkMeta(i, 16, 256) // 4 096 tokens: 16 KiB each
		mustRecord(t, tr, k, m)
	}
	if tr.Len() > 4 || tr.Evicted() < 16 {
		t.Fatalf("%d entries of 16 KiB kept under a 64 KiB bound (evicted %d)", tr.Len(), tr.Evicted())
	}
	// The count stays exact through replacements, removals and Reset.
	k, m := chunkMeta(19, 16, 256)
	mustRecord(t, tr, k, m)
	translate(tr, removed(offload.MediumCPU, k))
	var want int64
	for _, m := range tr.metas {
		want += m.size()
	}
	if tr.bytes != want || tr.bytes > 64<<10 {
		t.Fatalf("tracked %d bytes, entries hold %d", tr.bytes, want)
	}
	tr.Reset()
	if tr.bytes != 0 {
		t.Fatalf("%d bytes after Reset", tr.bytes)
	}
}

// Full-attention variants get self-describing events with their own kind,
// as vLLM sends them (get_kv_cache_spec_kind); groups without a prefix
// structure get placeholders.
func TestSpecKinds(t *testing.T) {
	for _, tc := range []struct {
		kind, wire string
		window     int
		rich       bool
	}{
		{"", SpecKindFullAttention, 0, true},
		{"full_attention", "full_attention", 0, true},
		{"mla_attention", "mla_attention", 0, true},
		{"sink_full_attention", "sink_full_attention", 0, true},
		{"sliding_window", "", 128, false},
		{"sliding_window_mla", "", 128, false},
		{"sliding_window_mla", "", 0, false},
		{"chunked_local_attention", "", 0, false},
		{"mamba", "", 0, false},
		{"mla_attention", "", 64, false},
	} {
		tr := mustTracker(t, TrackerConfig{SelfDescribing: true})
		k, m := chunkMeta(0, 1, 4)
		m.SpecKind, m.SlidingWindow = tc.kind, tc.window
		ok, err := tr.Record(k, m)
		if err != nil || ok != tc.rich {
			t.Errorf("Record(kind %q, window %d) = %v, %v; want %v", tc.kind, tc.window, ok, err, tc.rich)
			continue
		}
		got := translate(tr, stored(offload.MediumCPU, k))
		if got[0].SpecKind != tc.wire || (got[0].BlockSize != 0) != tc.rich {
			t.Errorf("kind %q: event kind %q block size %d; want kind %q, self-describing %v",
				tc.kind, got[0].SpecKind, got[0].BlockSize, tc.wire, tc.rich)
		}
	}
}

// TestTenantSpaces: a tenant's key is published under its space's hashes
// (never the engine's, which another space's copy of the block shares),
// its removal too; the salt goes on the first chunk of a request only; a
// key of an unknown space, or untagged, is published as it is.
func TestTenantSpaces(t *testing.T) {
	acme, _ := keyspace.New("tenant/acme")
	stray, _ := keyspace.New("tenant/gone")
	raw := chunkKey(7, 0)
	tr := mustTracker(t, TrackerConfig{Spaces: map[uint64]string{acme.ID(): SpacePrefix + "acme"}})
	got := translate(tr,
		offload.Event{Keys: []offload.Key{acme.Key([]byte(raw)), stray.Key([]byte(raw)), raw}, Medium: offload.MediumCPU},
		offload.Event{Keys: []offload.Key{acme.Key([]byte(raw))}, Medium: offload.MediumCPU, Removed: true})
	if len(got) != 4 {
		t.Fatalf("%d wire events, want 4", len(got))
	}
	acmeHash := SpaceHash(acme.ID(), raw.Hash())
	if acmeHash == raw.Hash() || got[0].BlockHashes[0] != acmeHash || got[0].Salt != "" {
		t.Errorf("acme's placeholder: hash %x salt %q; want acme's hash %x and no salt (no tokens, no request)", got[0].BlockHashes[0], got[0].Salt, acmeHash)
	}
	if got[1].Salt != "" || got[1].BlockHashes[0] != stray.Key([]byte(raw)).Hash() {
		t.Errorf("a key of an unknown space was taken for a tenant's: %+v", got[1])
	}
	if got[2].Salt != "" || got[2].BlockHashes[0] != raw.Hash() {
		t.Errorf("an untagged key changed: %+v", got[2])
	}
	if got[3].Type != BlockRemoved || got[3].BlockHashes[0] != acmeHash {
		t.Errorf("acme's removal: %+v, want acme's hash", got[3])
	}
}

// TestTenantTokens: token metadata of a tenant's key describes the
// engine's key (the tag stripped); its events carry the space's hashes,
// parents included, and the salt on the first chunk only; the default
// space's copy of the same chunks keeps the engine's hashes.
func TestTenantTokens(t *testing.T) {
	acme, _ := keyspace.New("tenant/acme")
	tr := mustTracker(t, TrackerConfig{SelfDescribing: true, Spaces: map[uint64]string{acme.ID(): "acme's salt"}})
	k0, m0 := chunkMeta(0, 2, 4)
	k1, m1 := chunkMeta(1, 2, 4)
	for _, k := range []offload.Key{acme.Key([]byte(k0)), k0} {
		mustRecord(t, tr, k, m0)
	}
	for _, k := range []offload.Key{acme.Key([]byte(k1)), k1} {
		mustRecord(t, tr, k, m1)
	}
	got := translate(tr, stored(offload.MediumCPU, acme.Key([]byte(k0)), acme.Key([]byte(k1)), k0, k1))
	sh := func(n uint64) string { return SpaceHash(acme.ID(), string(h(n))) }
	want := []struct {
		hashes       []string
		parent, salt string
	}{
		{[]string{sh(1000), sh(1001)}, "", "acme's salt"},
		{[]string{sh(1002), sh(1003)}, sh(1001), ""},
		{hs(1000, 1001), "", ""},
		{hs(1002, 1003), string(h(1001)), ""},
	}
	for i, w := range want {
		e := got[i]
		if !slices.Equal(e.BlockHashes, w.hashes) || e.ParentHash != w.parent || e.Salt != w.salt || len(e.TokenIDs) != 8 {
			t.Errorf("event %d: hashes %x parent %x salt %q tokens %d; want %x %x %q 8", i, e.BlockHashes, e.ParentHash, e.Salt, len(e.TokenIDs), w.hashes, w.parent, w.salt)
		}
	}
	// Metadata naming another chunk than the engine's key is refused in
	// a space as it is outside one.
	if _, err := tr.Record(acme.Key([]byte(k1)), m0); !errors.Is(err, ErrInvalidMeta) {
		t.Errorf("acme's chunk 1 recorded with chunk 0's tokens: %v", err)
	}
}
