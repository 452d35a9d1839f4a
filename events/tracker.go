package events

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/kvtier/kvtier/keyspace"
	"github.com/kvtier/kvtier/offload"
)

// ErrInvalidMeta reports token metadata that cannot describe its key.
var ErrInvalidMeta = errors.New("invalid token metadata")

// Limits on token metadata accepted from the engine. They bound the memory
// of the side table (docs/design.md §7) while leaving ample room: a chunk is at
// most a few thousand tokens.
const (
	// DefaultMaxEntries is the default bound on keys with metadata.
	DefaultMaxEntries = 1 << 20
	// DefaultMaxBytes is the default bound on the metadata's memory: about
	// the size of DefaultMaxEntries entries for 16-token chunks.
	DefaultMaxBytes = 256 << 20
	// MaxMetaHashes bounds the hash blocks of one chunk.
	MaxMetaHashes = 4096
	// MaxMetaTokens bounds the tokens of one chunk.
	MaxMetaTokens = 1 << 18
)

// TokenMeta is what the engine knows about one offloaded chunk, attached
// with Tracker.Record so that stored events can describe the chunk fully
// (docs/semantics.md §6.3, self-describing form).
type TokenMeta struct {
	// BlockHashes are the chunk's per-hash-block hashes (raw engine bytes)
	// in token order; the last one is the key's own hash.
	BlockHashes [][]byte
	// ParentHash is the hash of the block preceding the chunk; nil for the
	// first chunk of a sequence.
	ParentHash []byte
	// TokenIDs are the chunk's tokens: BlockSize × len(BlockHashes) of them.
	TokenIDs []uint32
	// BlockSize is the number of tokens per hash block (tokens_per_hash).
	BlockSize int
	// LoraID (0 = none) and LoraName ("" = none) identify the adapter.
	LoraID   int
	LoraName string
	// SpecKind is the KV group's kind as vLLM names it
	// (KVCacheSpecKind: "full_attention", "mla_attention", ...); "" means
	// full attention. Full-attention variants (MLA, sink) get
	// self-describing events carrying their kind, as vLLM sends them;
	// groups whose blocks do not form a prefix (sliding window, chunked
	// local attention, SSM) get placeholders.
	SpecKind string
	// SlidingWindow is the group's window in tokens, 0 for none; a group
	// with a window gets placeholders.
	SlidingWindow int
}

// meta is the validated copy of a TokenMeta kept per key. Only holders
// changes after Record, under Tracker.mu.
type meta struct {
	seq       uint64 // Record order, matches one fifo entry
	hashes    []string
	parent    string
	tokens    []uint32
	blockSize int
	loraID    int
	loraName  string
	specKind  string
	// salt is the space's salt when the chunk is a request's first
	// (parent == "") in a tenant's or shared space.
	salt string
	// holders are the residencies that announced the key stored and have
	// not announced its removal. The metadata lives until the last of
	// them removes the key: a removal from one medium must carry the same
	// hashes as the store on every other, or a consumer indexing by
	// (hash, medium) keeps the chunk's blocks forever.
	holders []residency
}

// residency is one place that holds a key: the emitting tier and its
// medium (vLLM keys it by medium and ownership).
type residency struct {
	tier   string
	medium offload.Medium
}

// SelfDescribingKind reports whether vLLM sends self-describing events for
// a KV group of kind (KVCacheSpecKind, "" for full attention) and sliding
// window: the full-attention family does, groups whose blocks do not form
// a prefix get placeholders.
func SelfDescribingKind(kind string, slidingWindow int) bool {
	if slidingWindow != 0 {
		return false
	}
	switch kind {
	case "", SpecKindFullAttention, SpecKindMLA, SpecKindSinkFullAttention:
		return true
	}
	return false
}

// TrackerConfig configures translation.
type TrackerConfig struct {
	// SelfDescribing enables token metadata (vLLM's opt-in
	// self_describing_kv_events). When false, Record captures nothing and
	// every event is a placeholder.
	SelfDescribing bool
	// MediumNames renames media on the wire for routers with another
	// vocabulary, keyed by the canonical name ("CPU", "STORAGE"), e.g.
	// {"STORAGE": "DISK"}. Unlisted media keep their canonical name.
	MediumNames map[string]string
	// Ownership writes the emitting tier's name as the ownership field of
	// secondary-tier events (a later vLLM field; off by default because
	// #48123-era consumers do not know it).
	Ownership bool
	// MaxEntries bounds the keys with metadata (default DefaultMaxEntries).
	// Beyond it Record evicts the oldest recorded key: metadata of a chunk
	// whose store never happened would otherwise stay forever, and the
	// oldest entries are the likeliest to be such leftovers. An entry costs
	// about 150 bytes plus 4 per token and the hash bytes.
	MaxEntries int
	// MaxBytes bounds the memory of the metadata, estimated from its
	// tokens and hashes (default DefaultMaxBytes); beyond it Record evicts
	// the oldest recorded keys like MaxEntries does.
	MaxBytes int64
	// Spaces are the salts of the key spaces of the daemon's tenants and
	// shared spaces (package keyspace), by ID: SpacePrefix + the space's
	// name, or the salt its configuration sets. A key of one of them is
	// published under its space's hashes (SpaceHash of the engine's
	// hashes), and the BlockStored of a request's first chunk carries the
	// salt where vLLM writes a request's cache_salt (BlockEvent.Salt).
	// Keys of spaces not listed are published as they are.
	Spaces map[uint64]string
}

// Tracker translates offloading events into wire events and keeps the
// token metadata side table. It is safe for concurrent use: the engine API
// records metadata while the step loop translates.
type Tracker struct {
	selfDescribing bool
	ownership      bool
	spaces         map[uint64]string
	maxEntries     int
	maxBytes       int64
	medium         [3]string // by offload.Medium

	mu      sync.Mutex
	metas   map[offload.Key]*meta
	fifo    []fifoEntry // Record order; entries whose seq no longer matches are stale
	seq     uint64
	evicted uint64
	bytes   int64
	groups  []uint32      // scratch for grouping removals
	removed []offload.Key // scratch: keys removed in the batch being translated
}

// metaOverhead approximates the fixed cost of one entry: the meta struct,
// its map slot and its eviction-queue entry.
const metaOverhead = 160

// size estimates the memory an entry holds, for TrackerConfig.MaxBytes.
func (m *meta) size() int64 {
	n := int64(metaOverhead + 4*len(m.tokens) + len(m.parent) + len(m.loraName))
	for _, h := range m.hashes {
		n += int64(16 + len(h))
	}
	return n
}

type fifoEntry struct {
	key offload.Key
	seq uint64
}

// NewTracker validates cfg and returns a Tracker.
func NewTracker(cfg TrackerConfig) (*Tracker, error) {
	t := &Tracker{
		selfDescribing: cfg.SelfDescribing,
		ownership:      cfg.Ownership,
		spaces:         cfg.Spaces,
		maxEntries:     cfg.MaxEntries,
		maxBytes:       cfg.MaxBytes,
		metas:          make(map[offload.Key]*meta),
	}
	if t.maxEntries <= 0 {
		t.maxEntries = DefaultMaxEntries
	}
	if t.maxBytes <= 0 {
		t.maxBytes = DefaultMaxBytes
	}
	t.medium[offload.MediumCPU] = MediumCPU
	t.medium[offload.MediumStorage] = MediumStorage
	for canon, name := range cfg.MediumNames {
		if name == "" {
			return nil, fmt.Errorf("events: medium_names[%q]: empty wire name", canon)
		}
		switch canon {
		case MediumCPU:
			t.medium[offload.MediumCPU] = name
		case MediumStorage:
			t.medium[offload.MediumStorage] = name
		default:
			return nil, fmt.Errorf("events: medium_names: unknown medium %q (want %s or %s)", canon, MediumCPU, MediumStorage)
		}
	}
	return t, nil
}

// Record attaches token metadata to key, replacing any earlier metadata,
// and evicts the oldest entry when the table is full. It reports whether
// the metadata was captured: nothing is captured when self-describing
// events are off or for non-full-attention groups. Invalid metadata is an error wrapping
// ErrInvalidMeta and leaves the table unchanged. meta is copied.
func (t *Tracker) Record(key offload.Key, tm TokenMeta) (bool, error) {
	if !t.selfDescribing {
		return false, nil
	}
	if !SelfDescribingKind(tm.SpecKind, tm.SlidingWindow) {
		return false, nil
	}
	id, salt := t.spaceOf(key)
	m, err := newMeta(key, id, tm)
	if err != nil {
		return false, err
	}
	if m.parent == "" {
		m.salt = salt
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.seq++
	m.seq = t.seq
	if old := t.metas[key]; old != nil {
		// A re-record (a new request storing the same chunk) must not
		// forget where the key already is.
		m.holders = append(m.holders, old.holders...)
	}
	t.drop(key)
	t.metas[key] = m
	t.bytes += m.size()
	t.fifo = append(t.fifo, fifoEntry{key, m.seq})
	for len(t.metas) > t.maxEntries || t.bytes > t.maxBytes {
		e := t.fifo[0]
		t.fifo = t.fifo[1:]
		if old := t.metas[e.key]; old != nil && old.seq == e.seq {
			t.drop(e.key)
			t.evicted++
		}
	}
	// Removals and replacements leave stale entries behind; compact once
	// they outnumber the live ones so that the queue stays O(entries).
	if len(t.fifo) > 2*len(t.metas)+1024 {
		live := make([]fifoEntry, 0, 2*len(t.metas)+16)
		for _, e := range t.fifo {
			if m := t.metas[e.key]; m != nil && m.seq == e.seq {
				live = append(live, e)
			}
		}
		t.fifo = live
	}
	return true, nil
}

// drop deletes key's metadata, if any; t.mu is held.
func (t *Tracker) drop(key offload.Key) {
	if m := t.metas[key]; m != nil {
		t.bytes -= m.size()
		delete(t.metas, key)
	}
}

// newMeta validates tm as the metadata of key, a key of the space id (0:
// untagged or unknown), and converts its hashes to the space's.
func newMeta(key offload.Key, id uint64, tm TokenMeta) (*meta, error) {
	if !key.Valid() {
		return nil, fmt.Errorf("events: record %q: %w", key, offload.ErrInvalidKey)
	}
	n := len(tm.BlockHashes)
	switch {
	case n == 0:
		return nil, fmt.Errorf("events: record %s: %w: no block hashes", key, ErrInvalidMeta)
	case n > MaxMetaHashes:
		return nil, fmt.Errorf("events: record %s: %w: %d block hashes (max %d)", key, ErrInvalidMeta, n, MaxMetaHashes)
	case tm.BlockSize <= 0:
		return nil, fmt.Errorf("events: record %s: %w: block size %d", key, ErrInvalidMeta, tm.BlockSize)
	case len(tm.TokenIDs) > MaxMetaTokens || len(tm.TokenIDs) != n*tm.BlockSize:
		return nil, fmt.Errorf("events: record %s: %w: %d tokens for %d hash blocks of %d", key, ErrInvalidMeta, len(tm.TokenIDs), n, tm.BlockSize)
	case tm.LoraID < 0:
		return nil, fmt.Errorf("events: record %s: %w: lora id %d", key, ErrInvalidMeta, tm.LoraID)
	case len(tm.ParentHash) > offload.MaxKeyLen:
		return nil, fmt.Errorf("events: record %s: %w: parent hash of %d bytes", key, ErrInvalidMeta, len(tm.ParentHash))
	}
	m := &meta{
		hashes:    make([]string, n),
		parent:    string(tm.ParentHash),
		tokens:    append([]uint32(nil), tm.TokenIDs...),
		blockSize: tm.BlockSize,
		loraID:    tm.LoraID,
		loraName:  tm.LoraName,
		specKind:  tm.SpecKind,
	}
	if m.specKind == "" {
		m.specKind = SpecKindFullAttention
	}
	for i, h := range tm.BlockHashes {
		if len(h) == 0 || len(h) > offload.MaxKeyLen {
			return nil, fmt.Errorf("events: record %s: %w: block hash %d has %d bytes", key, ErrInvalidMeta, i, len(h))
		}
		m.hashes[i] = string(h)
	}
	// The key names the chunk by its last hash block; metadata for another
	// chunk would make routers believe in tokens that are not stored. A
	// tenant's key is its space's tag and the engine's key: the engine's
	// hashes describe the latter.
	own := key
	if id != 0 {
		own = key[keyspace.TagLen:]
	}
	if m.hashes[n-1] != own.Hash() {
		return nil, fmt.Errorf("events: record %s: %w: last block hash differs from the key's hash", key, ErrInvalidMeta)
	}
	if id != 0 {
		for i, h := range m.hashes {
			m.hashes[i] = SpaceHash(id, h)
		}
		if m.parent != "" {
			m.parent = SpaceHash(id, m.parent)
		}
	}
	return m, nil
}

// Has reports whether key has metadata.
func (t *Tracker) Has(key offload.Key) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, ok := t.metas[key]
	return ok
}

// Len returns the number of keys with metadata.
func (t *Tracker) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.metas)
}

// Evicted returns how many entries the MaxEntries bound evicted.
func (t *Tracker) Evicted() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.evicted
}

// Reset clears the side table (the daemon's reset_cache).
func (t *Tracker) Reset() {
	t.mu.Lock()
	defer t.mu.Unlock()
	clear(t.metas)
	clear(t.fifo)
	t.fifo = t.fifo[:0]
	t.bytes = 0
}

// MediumName returns the wire name of m ("" for an unspecified medium,
// which encodes as nil).
func (t *Tracker) MediumName(m offload.Medium) string {
	if int(m) < len(t.medium) {
		return t.medium[m]
	}
	return ""
}

func localityName(l offload.Locality) string {
	switch l {
	case offload.LocalityLocal:
		return LocalityLocal
	case offload.LocalityRemote:
		return LocalityRemote
	}
	return ""
}

// Translate appends the wire events of evs to dst in order (docs/semantics.md §6.3):
// one BlockStored per stored key, and per removal event one BlockRemoved
// per KV group (groups in order of first appearance) carrying the
// concatenated hashes. A key's metadata is dropped once every residency
// that announced it has removed it, checked at the end of the batch: a
// primary removal may precede, in the same batch, the store of a cascade
// that still holds the key. Events without keys produce nothing.
func (t *Tracker) Translate(dst *Batch, evs []offload.Event) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.removed = t.removed[:0]
	defer t.dropUnheld()
	for i := range evs {
		ev := &evs[i]
		if len(ev.Keys) == 0 {
			continue
		}
		medium := t.MediumName(ev.Medium)
		locality := localityName(ev.Locality)
		owner := ""
		if t.ownership {
			owner = ev.Tier
		}
		if ev.Removed {
			t.translateRemoved(dst, ev, medium, locality, owner)
			continue
		}
		res := residency{ev.Tier, ev.Medium}
		for _, k := range ev.Keys {
			we := BlockEvent{
				Type:        BlockStored,
				Medium:      medium,
				GroupIdx:    k.Group(),
				HasGroupIdx: true,
				Locality:    locality,
				Ownership:   owner,
			}
			if m := t.metas[k]; m != nil {
				we.BlockHashes = m.hashes
				we.ParentHash = m.parent
				we.TokenIDs = m.tokens
				we.BlockSize = m.blockSize
				we.LoraID = m.loraID
				we.LoraName = m.loraName
				we.SpecKind = m.specKind
				we.Salt = m.salt
				if !slices.Contains(m.holders, res) {
					m.holders = append(m.holders, res)
				}
			} else {
				start := len(dst.hashes)
				dst.hashes = append(dst.hashes, t.wireHash(k))
				we.BlockHashes = dst.run(start)
			}
			dst.Events = append(dst.Events, we)
		}
	}
}

// spaceOf returns the ID and salt of k's space; 0 and "" for an untagged
// key or one of a space the tracker does not know.
func (t *Tracker) spaceOf(k offload.Key) (id uint64, salt string) {
	if len(t.spaces) == 0 {
		return 0, ""
	}
	if id, ok := keyspace.IDOf(k); ok {
		if salt := t.spaces[id]; salt != "" {
			return id, salt
		}
	}
	return 0, ""
}

// wireHash returns the hash k is published under: the engine's, or for a
// key of a known space its space's (SpaceHash).
func (t *Tracker) wireHash(k offload.Key) string {
	if id, _ := t.spaceOf(k); id != 0 {
		return SpaceHash(id, k[keyspace.TagLen:].Hash())
	}
	return k.Hash()
}

// SpaceHash returns the hash a tenant's or shared space's block is
// published under: the engine's hash h with its last 8 bytes (those vLLM's
// integer form keeps, offload.WireHash) XORed with the space's ID, big-
// endian. Two spaces' copies of the same block thus never share a wire
// hash — a router indexing by hash cannot credit one space's block to
// another, and a removal names one space's copy — while a router that
// knows the space's ID can still compute the hash from the engine's.
func SpaceHash(id uint64, h string) string {
	b := []byte(h)
	for i := 0; i < 8 && i < len(b); i++ {
		b[len(b)-1-i] ^= byte(id >> (8 * i))
	}
	return string(b)
}

func (t *Tracker) translateRemoved(dst *Batch, ev *offload.Event, medium, locality, owner string) {
	keys := ev.Keys
	res := residency{ev.Tier, ev.Medium}
	groups := t.groups[:0]
	for _, k := range keys {
		g := k.Group()
		seen := false
		for _, have := range groups {
			if have == g {
				seen = true
				break
			}
		}
		if !seen {
			groups = append(groups, g)
		}
	}
	t.groups = groups
	for _, g := range groups {
		start := len(dst.hashes)
		for _, k := range keys {
			if k.Group() != g {
				continue
			}
			if m := t.metas[k]; m != nil {
				dst.hashes = append(dst.hashes, m.hashes...)
				if i := slices.Index(m.holders, res); i >= 0 {
					m.holders = slices.Delete(m.holders, i, i+1)
				}
				t.removed = append(t.removed, k)
			} else {
				dst.hashes = append(dst.hashes, t.wireHash(k))
			}
		}
		dst.Events = append(dst.Events, BlockEvent{
			Type:        BlockRemoved,
			BlockHashes: dst.run(start),
			Medium:      medium,
			GroupIdx:    g,
			HasGroupIdx: true,
			Locality:    locality,
			Ownership:   owner,
		})
	}
}

// dropUnheld drops the metadata of the keys removed in this batch that no
// residency holds any more; t.mu is held.
func (t *Tracker) dropUnheld() {
	for _, k := range t.removed {
		if m := t.metas[k]; m != nil && len(m.holders) == 0 {
			t.drop(k)
		}
	}
	t.removed = t.removed[:0]
}
