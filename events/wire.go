package events

import "fmt"

// EventType is the tag of a wire event: the name of vLLM's msgspec struct.
type EventType uint8

// Wire event types (docs/semantics.md §6.4).
const (
	BlockStored EventType = iota
	BlockRemoved
	AllBlocksCleared
)

// String returns the tag written on the wire.
func (t EventType) String() string {
	switch t {
	case BlockStored:
		return "BlockStored"
	case BlockRemoved:
		return "BlockRemoved"
	case AllBlocksCleared:
		return "AllBlocksCleared"
	}
	return fmt.Sprintf("EventType(%d)", uint8(t))
}

// Wire names of the media (docs/semantics.md §6.2). MediumGPU is reserved for engines'
// own prefix-cache events; kvtier never emits it.
const (
	MediumCPU     = "CPU"
	MediumStorage = "STORAGE"
	MediumGPU     = "GPU"
)

// Wire names of the localities (docs/semantics.md §1.3).
const (
	LocalityLocal  = "LOCAL"
	LocalityRemote = "REMOTE"
)

// kv_cache_spec_kind values of the full-attention family (vLLM's
// KVCacheSpecKind), the kinds for which self-describing events are
// produced; see SelfDescribingKind.
const (
	SpecKindFullAttention     = "full_attention"
	SpecKindMLA               = "mla_attention"
	SpecKindSinkFullAttention = "sink_full_attention"
)

// BlockEvent is one wire event before encoding. Optional fields use their
// zero value for "absent" (msgpack nil, or omitted when vLLM's field has a
// default), which is unambiguous because none of them can legitimately be
// zero on the wire: LoRA ids start at 1, an empty medium or locality is
// not a value, and sliding windows are positive.
//
// Hashes are the engine's raw block hash bytes; the Format decides whether
// they go on the wire as uint64 (vLLM's default) or as raw bytes. Slices in
// a BlockEvent produced by a Tracker are shared and must not be modified.
type BlockEvent struct {
	Type EventType

	// BlockHashes: BlockStored and BlockRemoved (required).
	BlockHashes []string
	// ParentHash: BlockStored; "" is nil (chunk 0 or placeholder).
	ParentHash string
	// TokenIDs: BlockStored; nil encodes as the empty list.
	TokenIDs []uint32
	// BlockSize: BlockStored, tokens per hash block; 0 for placeholders.
	BlockSize int
	// LoraID: BlockStored; 0 is nil.
	LoraID int
	// LoraName: BlockStored; "" is nil.
	LoraName string
	// Medium: BlockStored and BlockRemoved (required, nullable); "" is nil.
	Medium string
	// GroupIdx is written when HasGroupIdx (kvtier always knows the group;
	// the field exists for events relayed from elsewhere).
	GroupIdx    uint32
	HasGroupIdx bool
	// SpecKind: BlockStored kv_cache_spec_kind; "" is omitted.
	SpecKind string
	// SlidingWindow: BlockStored kv_cache_spec_sliding_window; 0 is omitted.
	SlidingWindow int
	// Locality: "" is omitted (unspecified).
	Locality string
	// Ownership: the secondary tier that owns the copy; "" is omitted.
	Ownership string
	// Salt: BlockStored, the salt of the tenant's (or shared space's)
	// key space, set on the event of a request's first chunk only. It is
	// written as extra_keys exactly where and how vLLM writes a request's
	// cache_salt: a one-element tuple for the first hash block, nil for
	// the others. "" writes no extra_keys.
	Salt string
}

// Batch holds the wire events of one step. A Batch is reused across steps
// so that translation does not allocate per event once its buffers have
// grown to the working size.
type Batch struct {
	Events []BlockEvent
	// hashes backs the BlockHashes of placeholder and removal events.
	hashes []string
}

// Reset empties b, keeping its buffers.
func (b *Batch) Reset() {
	clear(b.Events) // drop references to metadata and keys
	b.Events = b.Events[:0]
	clear(b.hashes)
	b.hashes = b.hashes[:0]
}

// Len returns the number of events in b.
func (b *Batch) Len() int { return len(b.Events) }

// run returns the hashes appended to b's backing store since start.
// Earlier runs stay valid when the backing store grows: a grown store is a
// copy, and the old array is never written again.
func (b *Batch) run(start int) []string {
	return b.hashes[start:len(b.hashes):len(b.hashes)]
}
