package events

import (
	"github.com/tinylib/msgp/msgp"

	"github.com/kvtier/kvtier/offload"
)

// Format selects the msgpack shape of events (docs/semantics.md §6.4). The zero value is
// what current vLLM publishes: map-encoded events and uint64 hashes.
type Format struct {
	// Positional encodes events as the arrays of vLLM ≤ 0.23
	// (["BlockStored", f1, ..., f11], every field of that release's
	// schema, byte-identical to its msgspec encoder) instead of maps tagged
	// by "type". Locality and ownership do not exist in that schema and
	// are not written. llm-d-kv-cache main decodes only this form.
	Positional bool
	// RawHashes writes hashes as msgpack bin with the engine's full hash
	// bytes, like vLLM with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0, instead
	// of the low 64 bits as an unsigned integer.
	RawHashes bool
}

// Field names of vLLM's event structs and tags, pre-encoded as msgpack
// strings: appending constant bytes is several times cheaper than
// re-encoding them for every event. Read-only after initialisation.
var (
	kType          = msgp.AppendString(nil, "type")
	kBlockHashes   = msgp.AppendString(nil, "block_hashes")
	kParent        = msgp.AppendString(nil, "parent_block_hash")
	kTokenIDs      = msgp.AppendString(nil, "token_ids")
	kBlockSize     = msgp.AppendString(nil, "block_size")
	kLoraID        = msgp.AppendString(nil, "lora_id")
	kMedium        = msgp.AppendString(nil, "medium")
	kLoraName      = msgp.AppendString(nil, "lora_name")
	kGroupIdx      = msgp.AppendString(nil, "group_idx")
	kSpecKind      = msgp.AppendString(nil, "kv_cache_spec_kind")
	kSlidingWindow = msgp.AppendString(nil, "kv_cache_spec_sliding_window")
	kLocality      = msgp.AppendString(nil, "locality")
	kOwnership     = msgp.AppendString(nil, "ownership")
	kExtraKeys     = msgp.AppendString(nil, "extra_keys")

	tagStored  = msgp.AppendString(nil, BlockStored.String())
	tagRemoved = msgp.AppendString(nil, BlockRemoved.String())
	tagCleared = msgp.AppendString(nil, AllBlocksCleared.String())
)

// AppendBatch appends the msgpack encoding of the batch
// [ts, events, dp_rank] to dst. It allocates only when dst must grow.
func (f Format) AppendBatch(dst []byte, ts float64, evs []BlockEvent, dpRank int) []byte {
	dst = msgp.AppendArrayHeader(dst, 3)
	// msgspec writes every Python float as float64.
	dst = msgp.AppendFloat64(dst, ts)
	dst = msgp.AppendArrayHeader(dst, uint32(len(evs)))
	for i := range evs {
		dst = f.AppendEvent(dst, &evs[i])
	}
	return appendInt(dst, dpRank)
}

// AppendEvent appends the msgpack encoding of one event to dst.
func (f Format) AppendEvent(dst []byte, ev *BlockEvent) []byte {
	switch ev.Type {
	case BlockStored:
		if f.Positional {
			return f.appendStoredArray(dst, ev)
		}
		return f.appendStoredMap(dst, ev)
	case BlockRemoved:
		if f.Positional {
			return f.appendRemovedArray(dst, ev)
		}
		return f.appendRemovedMap(dst, ev)
	default:
		if f.Positional {
			dst = msgp.AppendArrayHeader(dst, 1)
			return append(dst, tagCleared...)
		}
		dst = msgp.AppendMapHeader(dst, 1)
		dst = append(dst, kType...)
		return append(dst, tagCleared...)
	}
}

func (f Format) appendStoredMap(dst []byte, ev *BlockEvent) []byte {
	// type + the seven fields without a default, then the present optional
	// fields (extra_keys only for a tenant's blocks).
	n := uint32(8)
	n += b2u(ev.HasGroupIdx) + b2u(ev.SpecKind != "") + b2u(ev.SlidingWindow != 0) +
		b2u(ev.Locality != "") + b2u(ev.Ownership != "") + b2u(ev.Salt != "")
	// msgspec sizes a struct's map header for all its fields before it
	// knows how many omit_defaults leaves out: BlockStored has more than
	// 15 (with the tag), so vLLM writes map16 even for 9 entries.
	dst = append(dst, 0xde, byte(n>>8), byte(n))
	dst = append(dst, kType...)
	dst = append(dst, tagStored...)
	dst = append(dst, kBlockHashes...)
	dst = f.appendHashes(dst, ev.BlockHashes)
	dst = append(dst, kParent...)
	dst = f.appendOptHash(dst, ev.ParentHash)
	dst = append(dst, kTokenIDs...)
	dst = appendTokens(dst, ev.TokenIDs)
	dst = append(dst, kBlockSize...)
	dst = appendInt(dst, ev.BlockSize)
	dst = append(dst, kLoraID...)
	dst = appendOptInt(dst, ev.LoraID)
	dst = append(dst, kMedium...)
	dst = appendOptString(dst, ev.Medium)
	dst = append(dst, kLoraName...)
	dst = appendOptString(dst, ev.LoraName)
	if ev.Salt != "" {
		dst = append(dst, kExtraKeys...)
		dst = appendExtraKeys(dst, ev)
	}
	if ev.HasGroupIdx {
		dst = append(dst, kGroupIdx...)
		dst = msgp.AppendUint32(dst, ev.GroupIdx)
	}
	if ev.SpecKind != "" {
		dst = append(dst, kSpecKind...)
		dst = msgp.AppendString(dst, ev.SpecKind)
	}
	if ev.SlidingWindow != 0 {
		dst = append(dst, kSlidingWindow...)
		dst = appendInt(dst, ev.SlidingWindow)
	}
	if ev.Locality != "" {
		dst = append(dst, kLocality...)
		dst = msgp.AppendString(dst, ev.Locality)
	}
	if ev.Ownership != "" {
		dst = append(dst, kOwnership...)
		dst = msgp.AppendString(dst, ev.Ownership)
	}
	return dst
}

// appendStoredArray writes the array form of vLLM ≤ 0.23 (before #42892):
// the tag, then all eleven fields of that release's BlockStored in
// declaration order. msgspec's array_like structs write every field, even
// with omit_defaults, and that schema has no locality or ownership, so
// neither is written: a positional consumer would read them as fields it
// does not have.
func (f Format) appendStoredArray(dst []byte, ev *BlockEvent) []byte {
	dst = msgp.AppendArrayHeader(dst, 12)
	dst = append(dst, tagStored...)
	dst = f.appendHashes(dst, ev.BlockHashes)
	dst = f.appendOptHash(dst, ev.ParentHash)
	dst = appendTokens(dst, ev.TokenIDs)
	dst = appendInt(dst, ev.BlockSize)
	dst = appendOptInt(dst, ev.LoraID)
	dst = appendOptString(dst, ev.Medium)
	dst = appendOptString(dst, ev.LoraName)
	if ev.Salt != "" {
		dst = appendExtraKeys(dst, ev)
	} else {
		dst = msgp.AppendNil(dst) // extra_keys
	}
	dst = appendOptGroup(dst, ev)
	dst = appendOptString(dst, ev.SpecKind)
	return appendOptInt(dst, ev.SlidingWindow)
}

func (f Format) appendRemovedMap(dst []byte, ev *BlockEvent) []byte {
	n := uint32(3) + b2u(ev.HasGroupIdx) + b2u(ev.Locality != "") + b2u(ev.Ownership != "")
	dst = msgp.AppendMapHeader(dst, n)
	dst = append(dst, kType...)
	dst = append(dst, tagRemoved...)
	dst = append(dst, kBlockHashes...)
	dst = f.appendHashes(dst, ev.BlockHashes)
	dst = append(dst, kMedium...)
	dst = appendOptString(dst, ev.Medium)
	if ev.HasGroupIdx {
		dst = append(dst, kGroupIdx...)
		dst = msgp.AppendUint32(dst, ev.GroupIdx)
	}
	if ev.Locality != "" {
		dst = append(dst, kLocality...)
		dst = msgp.AppendString(dst, ev.Locality)
	}
	if ev.Ownership != "" {
		dst = append(dst, kOwnership...)
		dst = msgp.AppendString(dst, ev.Ownership)
	}
	return dst
}

// appendRemovedArray writes vLLM ≤ 0.23's BlockRemoved: the tag,
// block_hashes, medium and group_idx, every field present.
func (f Format) appendRemovedArray(dst []byte, ev *BlockEvent) []byte {
	dst = msgp.AppendArrayHeader(dst, 4)
	dst = append(dst, tagRemoved...)
	dst = f.appendHashes(dst, ev.BlockHashes)
	dst = appendOptString(dst, ev.Medium)
	return appendOptGroup(dst, ev)
}

// SpacePrefix begins a key space's default salt: SpacePrefix + the name
// of the tenant or shared space.
const SpacePrefix = "kvtier_tenant:"

// appendExtraKeys writes the extra_keys of the first chunk of a request in
// a tenant's space the way vLLM writes them for a request with a
// cache_salt: (salt,) for the first hash block, nil for every other.
func appendExtraKeys(dst []byte, ev *BlockEvent) []byte {
	dst = msgp.AppendArrayHeader(dst, uint32(len(ev.BlockHashes)))
	for i := range ev.BlockHashes {
		if i > 0 {
			dst = msgp.AppendNil(dst)
			continue
		}
		dst = msgp.AppendArrayHeader(dst, 1)
		dst = msgp.AppendString(dst, ev.Salt)
	}
	return dst
}

func (f Format) appendHashes(dst []byte, hs []string) []byte {
	dst = msgp.AppendArrayHeader(dst, uint32(len(hs)))
	for _, h := range hs {
		dst = f.appendHash(dst, h)
	}
	return dst
}

func (f Format) appendHash(dst []byte, h string) []byte {
	if f.RawHashes {
		dst = msgp.AppendBytesHeader(dst, uint32(len(h)))
		return append(dst, h...)
	}
	return msgp.AppendUint64(dst, offload.WireHash(h))
}

func (f Format) appendOptHash(dst []byte, h string) []byte {
	if h == "" {
		return msgp.AppendNil(dst)
	}
	return f.appendHash(dst, h)
}

func appendTokens(dst []byte, toks []uint32) []byte {
	dst = msgp.AppendArrayHeader(dst, uint32(len(toks)))
	for _, t := range toks {
		dst = msgp.AppendUint32(dst, t)
	}
	return dst
}

// appendInt writes a Python int the way msgspec does: non-negative values
// in the smallest unsigned format, negative ones in the smallest signed.
func appendInt(dst []byte, v int) []byte {
	if v >= 0 {
		return msgp.AppendUint64(dst, uint64(v))
	}
	return msgp.AppendInt64(dst, int64(v))
}

func appendOptInt(dst []byte, v int) []byte {
	if v == 0 {
		return msgp.AppendNil(dst)
	}
	return appendInt(dst, v)
}

func appendOptString(dst []byte, s string) []byte {
	if s == "" {
		return msgp.AppendNil(dst)
	}
	return msgp.AppendString(dst, s)
}

func appendOptGroup(dst []byte, ev *BlockEvent) []byte {
	if !ev.HasGroupIdx {
		return msgp.AppendNil(dst)
	}
	return msgp.AppendUint32(dst, ev.GroupIdx)
}

func b2u(b bool) uint32 {
	if b {
		return 1
	}
	return 0
}
