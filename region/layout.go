package region

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// Layout describes an engine's region as vLLM laid it out: NumBlocks rows
// of RowStride bytes (one offload chunk per row), and what the bytes of a
// row mean (the model, its KV dtype, the chunking and the parallel layout
// that decide which worker's cells a row holds). Everything but NumBlocks
// names the data: two engines whose layouts differ only in NumBlocks read
// each other's blocks; any other difference and they never do.
type Layout struct {
	NumBlocks      int    `json:"num_blocks"`
	RowStride      int    `json:"row_stride"`
	BlocksPerChunk int    `json:"blocks_per_chunk"`
	TokensPerBlock int    `json:"tokens_per_block"`
	TokensPerHash  int    `json:"tokens_per_hash"`
	Model          string `json:"model"`
	DType          string `json:"dtype"`
	WorldSize      int    `json:"world_size"`
	TP             int    `json:"tp"`
	PP             int    `json:"pp"`
	PCP            int    `json:"pcp"`
	DCP            int    `json:"dcp"`
	Replicated     bool   `json:"replicated_layout"`
	Canonical      bool   `json:"canonical_layout"`
	// CPUPageSize is the bytes of one worker's cell in a row.
	CPUPageSize int `json:"cpu_page_size"`
	// KVCacheLayout is the worker KV cache layout's name (NHD, HND…).
	KVCacheLayout string `json:"kv_cache_layout,omitempty"`
	// Groups are the KV cache groups: their tokens per block and layers.
	Groups []Group `json:"groups,omitempty"`
}

// Group is one KV cache group of a layout.
type Group struct {
	TokensPerBlock int      `json:"tokens_per_block"`
	LayerNames     []string `json:"layer_names"`
}

// Limits a layout must respect: they bound what a client can make the
// daemon map and remember.
const (
	maxRegionBytes = 1 << 44 // 16 TiB
	maxModelLen    = 512
	maxGroups      = 64
	maxLayers      = 4096
)

// ErrLayout reports a layout the daemon refuses.
var ErrLayout = errors.New("region layout")

// ParseLayout decodes a layout from JSON (unknown fields are errors: a
// newer client's field this daemon ignores could name different bytes) and
// validates it.
func ParseLayout(data []byte) (Layout, error) {
	l, err := DecodeLayout(data)
	if err != nil {
		return l, err
	}
	return l, l.Validate()
}

// DecodeLayout decodes a layout from JSON without validating it.
func DecodeLayout(data []byte) (Layout, error) {
	var l Layout
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&l); err != nil {
		return l, fmt.Errorf("%w: %v", ErrLayout, err)
	}
	return l, nil
}

// Validate checks that the layout is one vLLM can produce and the daemon
// can hold.
func (l Layout) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrLayout}, args...)...)
	}
	switch {
	case l.NumBlocks <= 0:
		return bad("num_blocks %d: want at least 1", l.NumBlocks)
	case l.RowStride <= 0 || l.RowStride%4096 != 0:
		return bad("row_stride %d: want a positive multiple of the 4096-byte page", l.RowStride)
	case int64(l.NumBlocks)*int64(l.RowStride) > maxRegionBytes:
		return bad("%d blocks of %d bytes: more than %d bytes", l.NumBlocks, l.RowStride, int64(maxRegionBytes))
	case l.BlocksPerChunk <= 0:
		return bad("blocks_per_chunk %d: want at least 1", l.BlocksPerChunk)
	case l.Model == "" || len(l.Model) > maxModelLen:
		return bad("model %q: want 1 to %d bytes", l.Model, maxModelLen)
	case l.WorldSize <= 0:
		return bad("world_size %d: want at least 1", l.WorldSize)
	case l.CPUPageSize < 0 || l.CPUPageSize > l.RowStride:
		return bad("cpu_page_size %d: want 0 to row_stride %d", l.CPUPageSize, l.RowStride)
	case len(l.Groups) > maxGroups:
		return bad("%d KV cache groups: at most %d", len(l.Groups), maxGroups)
	}
	n := 0
	for _, g := range l.Groups {
		n += len(g.LayerNames)
	}
	if n > maxLayers {
		return bad("%d layers: at most %d", n, maxLayers)
	}
	return nil
}

// Size is the region's size in bytes.
func (l Layout) Size() int64 { return int64(l.NumBlocks) * int64(l.RowStride) }

// Namespace names the data the layout describes: the model (readable, with
// "/" replaced) and a digest of every field but NumBlocks. Engines whose
// layouts share it share blocks.
func (l Layout) Namespace() string {
	id := l
	id.NumBlocks = 0
	b, _ := json.Marshal(id) // fields in declaration order: stable
	sum := sha256.Sum256(b)
	return strings.ReplaceAll(l.Model, "/", "_") + "@" + hex.EncodeToString(sum[:6])
}
