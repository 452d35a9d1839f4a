package filemapper

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"unicode/utf16"

	"github.com/kvtier/kvtier/offload"
)

// digestLen is the number of hex digits of the namespace digest in the
// directory name (vLLM's _BASE_PATH_HASH_LEN).
const digestLen = 12

// ConfigFileName is the run-config record written next to the blocks.
const ConfigFileName = "config.json"

// KVCacheGroup describes one KV-cache group of the model, as vLLM records
// it in the namespace digest.
type KVCacheGroup struct {
	TokensPerBlock int      `yaml:"tokens_per_block" json:"tokens_per_block"`
	LayerNames     []string `yaml:"layer_names" json:"layer_names"`
}

// Namespace holds the fields that decide which directory a run's blocks
// live in (docs/semantics.md §5.1, vLLM's FileMapper). Two processes see each other's
// blocks exactly when every digest field matches; Rank only selects the
// `_r<rank>` sibling. The daemon fills it from the engine's registration.
type Namespace struct {
	ModelName     string `yaml:"model_name"`
	TokensPerHash int    `yaml:"tokens_per_hash"`
	BlocksPerFile int    `yaml:"blocks_per_file"` // 0 means 1
	TPSize        int    `yaml:"tp_size"`         // 0 means 1
	PPSize        int    `yaml:"pp_size"`         // 0 means 1
	PCPSize       int    `yaml:"pcp_size"`        // 0 means 1
	DCPSize       int    `yaml:"dcp_size"`        // 0 means 1
	// DType is hashed as given. vLLM 0.33 records the KV cache dtype
	// without "torch." ("bfloat16"); earlier releases wrote str(dtype)
	// ("torch.bfloat16"). `kvtier fs-layout` shows the directory either way.
	DType         string         `yaml:"dtype"`
	KVCacheGroups []KVCacheGroup `yaml:"kv_cache_groups"`
	// InferenceEngine is part of the digest; "" means "vllm".
	InferenceEngine string `yaml:"inference_engine"`
	// ParallelAgnostic is vLLM FileMapper's parallel_agnostic. vLLM's fs
	// tier asks for it and gets it when the model's KV blocks do not
	// depend on the parallel layout (one full-attention, non-MLA group
	// with head-sharded pages): true forces tp/pp/pcp/dcp to 1 and rank
	// to 0, as vLLM does; false adds "parallel_agnostic": false to the
	// digest, as vLLM does for every other model. Unset keeps the sizes as
	// given without the field, which equals true for tp 1 / rank 0.
	ParallelAgnostic *bool `yaml:"parallel_agnostic"`
	// ReplicatedLayout is FileMapper's replicated_layout (MLA under tensor
	// parallelism with parallel_agnostic): adds "replicated_layout": true.
	ReplicatedLayout bool `yaml:"replicated_layout"`
	// CanonicalFormat is FileMapper's canonical_format (vLLM's
	// canonical_layout option); "" means the direct layout.
	CanonicalFormat string `yaml:"canonical_format"`
	// Extra holds further digest fields that some vLLM versions add (for
	// example parallel_agnostic: false); they are hashed as given.
	Extra map[string]any `yaml:"extra_fields"`
	// Rank selects the block directory `<base>_r<rank>`; not hashed.
	Rank int `yaml:"rank"`
	// BlockBytes, when > 0, is the size every block must have; jobs over an
	// arena with another slot size fail. Not hashed (vLLM does not).
	BlockBytes int `yaml:"block_bytes"`
}

// WithDefaults returns ns with the defaults vLLM's FileMapper applies:
// sizes of 0 are 1, parallel_agnostic forces the parallel sizes to 1 and
// the rank to 0, and the inference engine is vllm.
func (ns Namespace) WithDefaults() Namespace {
	one := func(v *int) {
		if *v == 0 {
			*v = 1
		}
	}
	one(&ns.BlocksPerFile)
	one(&ns.TPSize)
	one(&ns.PPSize)
	one(&ns.PCPSize)
	one(&ns.DCPSize)
	if ns.ParallelAgnostic != nil && *ns.ParallelAgnostic {
		ns.TPSize, ns.PPSize, ns.PCPSize, ns.DCPSize, ns.Rank = 1, 1, 1, 1, 0
	}
	if ns.InferenceEngine == "" {
		ns.InferenceEngine = "vllm"
	}
	return ns
}

// Validate reports the first field that is not allowed (a missing model
// name, a negative size, an extra field that duplicates one of the
// namespace's), naming its key under namespace.
func (ns Namespace) Validate() error {
	if ns.ModelName == "" {
		return fmt.Errorf("namespace.model_name is required")
	}
	for name, v := range map[string]int{
		"tokens_per_hash": ns.TokensPerHash, "blocks_per_file": ns.BlocksPerFile,
		"tp_size": ns.TPSize, "pp_size": ns.PPSize, "pcp_size": ns.PCPSize, "dcp_size": ns.DCPSize,
		"rank": ns.Rank, "block_bytes": ns.BlockBytes,
	} {
		if v < 0 {
			return fmt.Errorf("namespace.%s: %d is negative", name, v)
		}
	}
	for k := range ns.Extra {
		switch k {
		case "model_name", "tokens_per_hash", "blocks_per_file", "tp_size", "pp_size",
			"pcp_size", "dcp_size", "dtype", "kv_cache_groups", "inference_engine":
			return fmt.Errorf("namespace.extra_fields: %q duplicates a namespace field", k)
		case "parallel_agnostic", "replicated_layout", "canonical_format":
			// Accepted for configs written before these keys existed, but
			// not both ways at once.
			if (k == "parallel_agnostic" && ns.ParallelAgnostic != nil) || (k == "replicated_layout" && ns.ReplicatedLayout) ||
				(k == "canonical_format" && ns.CanonicalFormat != "") {
				return fmt.Errorf("namespace: %s is given both as a key and in extra_fields", k)
			}
		}
	}
	return nil
}

// Fields returns the digest fields as vLLM's FileMapper builds them (after
// defaults), the content of config.json.
func (ns Namespace) Fields() map[string]any {
	ns = ns.WithDefaults()
	groups := make([]any, len(ns.KVCacheGroups))
	for i, g := range ns.KVCacheGroups {
		names := make([]any, len(g.LayerNames))
		for j, n := range g.LayerNames {
			names[j] = n
		}
		groups[i] = map[string]any{"tokens_per_block": g.TokensPerBlock, "layer_names": names}
	}
	f := map[string]any{
		"model_name":       ns.ModelName,
		"tokens_per_hash":  ns.TokensPerHash,
		"blocks_per_file":  ns.BlocksPerFile,
		"tp_size":          ns.TPSize,
		"pp_size":          ns.PPSize,
		"pcp_size":         ns.PCPSize,
		"dcp_size":         ns.DCPSize,
		"dtype":            ns.DType,
		"kv_cache_groups":  groups,
		"inference_engine": ns.InferenceEngine,
	}
	if ns.ParallelAgnostic != nil && !*ns.ParallelAgnostic {
		f["parallel_agnostic"] = false
	}
	if ns.ReplicatedLayout {
		f["replicated_layout"] = true
	}
	if ns.CanonicalFormat != "" {
		f["canonical_format"] = ns.CanonicalFormat
	}
	for k, v := range ns.Extra {
		f[k] = v
	}
	return f
}

// Digest returns the first 12 hex digits of the sha256 of the fields
// rendered as Python's json.dumps(fields, sort_keys=True,
// separators=(",", ":")) renders them, so kvtier and vLLM agree on the
// directory.
func (ns Namespace) Digest() (string, error) {
	b, err := appendPyJSON(nil, ns.Fields())
	if err != nil {
		return "", fmt.Errorf("namespace digest: %w", err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])[:digestLen], nil
}

// ParseRelPath is the inverse of RelPath; ok is false for anything
// RelPath would not have produced.
func ParseRelPath(rel string) (offload.Key, bool) {
	parts := strings.Split(filepath.ToSlash(rel), "/")
	if len(parts) != 3 || !strings.HasSuffix(parts[2], ".bin") {
		return "", false
	}
	h := strings.TrimSuffix(parts[2], ".bin")
	raw, err := hex.DecodeString(h)
	if err != nil || len(raw) == 0 || hex.EncodeToString(raw) != h {
		return "", false // not lowercase hex
	}
	sub, gs, ok := strings.Cut(parts[1], "_g")
	if !ok || parts[0] != h[:min(3, len(h))] || sub != h[min(3, len(h)):min(5, len(h))] {
		return "", false
	}
	g, err := strconv.ParseUint(gs, 10, 32)
	if err != nil || strconv.FormatUint(g, 10) != gs {
		return "", false
	}
	k := offload.MakeKey(raw, uint32(g))
	if !k.Valid() {
		return "", false
	}
	return k, true
}

// appendPyJSON appends v rendered like Python's json.dumps with
// sort_keys=True, separators=(",", ":") and the default ensure_ascii=True:
// the form vLLM hashes into the directory name.
func appendPyJSON(b []byte, v any) ([]byte, error) {
	return pyJSON{}.append(b, v, 0)
}

// ConfigJSON returns the content vLLM writes to config.json for ns:
// json.dump(fields, f, indent=2, sort_keys=True), so non-ASCII as \uXXXX,
// no HTML escaping and no trailing newline. A directory shared with vLLM
// then holds the same file whoever created it.
func (ns Namespace) ConfigJSON() ([]byte, error) {
	return pyJSON{indent: 2}.append(nil, ns.Fields(), 0)
}

// pyJSON renders values as Python's json module does with sort_keys=True
// and ensure_ascii=True; indent > 0 is json.dump's indent (separators ","
// and ": "), 0 the compact separators "," and ":".
type pyJSON struct{ indent int }

// item writes what precedes item i of a non-empty container at depth.
func (p pyJSON) item(b []byte, i, depth int) []byte {
	if i > 0 {
		b = append(b, ',')
	}
	if p.indent > 0 {
		b = append(b, '\n')
		b = append(b, strings.Repeat(" ", p.indent*(depth+1))...)
	}
	return b
}

func (p pyJSON) close(b []byte, depth int, c byte) []byte {
	if p.indent > 0 {
		b = append(b, '\n')
		b = append(b, strings.Repeat(" ", p.indent*depth)...)
	}
	return append(b, c)
}

func (p pyJSON) append(b []byte, v any, depth int) ([]byte, error) {
	switch x := v.(type) {
	case nil:
		return append(b, "null"...), nil
	case bool:
		if x {
			return append(b, "true"...), nil
		}
		return append(b, "false"...), nil
	case string:
		return appendPyString(b, x), nil
	case int:
		return strconv.AppendInt(b, int64(x), 10), nil
	case int64:
		return strconv.AppendInt(b, x, 10), nil
	case uint64:
		return strconv.AppendUint(b, x, 10), nil
	case float64:
		return appendPyFloat(b, x)
	case []string:
		items := make([]any, len(x))
		for i, e := range x {
			items[i] = e
		}
		return p.append(b, items, depth)
	case []any:
		b = append(b, '[')
		if len(x) == 0 {
			return append(b, ']'), nil
		}
		for i, e := range x {
			b = p.item(b, i, depth)
			var err error
			if b, err = p.append(b, e, depth+1); err != nil {
				return nil, err
			}
		}
		return p.close(b, depth, ']'), nil
	case map[string]any:
		b = append(b, '{')
		if len(x) == 0 {
			return append(b, '}'), nil
		}
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		slices.Sort(keys) // UTF-8 byte order = code point order, as Python
		for i, k := range keys {
			b = p.item(b, i, depth)
			b = appendPyString(b, k)
			b = append(b, ':')
			if p.indent > 0 {
				b = append(b, ' ')
			}
			var err error
			if b, err = p.append(b, x[k], depth+1); err != nil {
				return nil, err
			}
		}
		return p.close(b, depth, '}'), nil
	}
	return nil, fmt.Errorf("unsupported value of type %T", v)
}

// appendPyString escapes like Python's json with ensure_ascii: the short
// escapes for " \ \n \r \t \b \f, \u00XX for other control characters
// and \uXXXX (surrogate pairs beyond the BMP) for everything non-ASCII.
func appendPyString(b []byte, s string) []byte {
	const hexDigits = "0123456789abcdef"
	u4 := func(b []byte, r uint16) []byte {
		return append(b, '\\', 'u', hexDigits[r>>12], hexDigits[r>>8&15], hexDigits[r>>4&15], hexDigits[r&15])
	}
	b = append(b, '"')
	for _, r := range s {
		switch {
		case r == '"':
			b = append(b, '\\', '"')
		case r == '\\':
			b = append(b, '\\', '\\')
		case r == '\n':
			b = append(b, '\\', 'n')
		case r == '\r':
			b = append(b, '\\', 'r')
		case r == '\t':
			b = append(b, '\\', 't')
		case r == '\b':
			b = append(b, '\\', 'b')
		case r == '\f':
			b = append(b, '\\', 'f')
		case r < 0x20 || r == 0x7f: // Python escapes everything outside " "..."~"
			b = u4(b, uint16(r))
		case r < 0x80:
			b = append(b, byte(r))
		case r > 0xffff:
			r1, r2 := utf16.EncodeRune(r)
			b = u4(u4(b, uint16(r1)), uint16(r2))
		default:
			b = u4(b, uint16(r))
		}
	}
	return append(b, '"')
}

// appendPyFloat renders f as Python's float repr: shortest round-trip
// digits, positional for exponents in [-4, 16), ".0" for integral values.
func appendPyFloat(b []byte, f float64) ([]byte, error) {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return nil, fmt.Errorf("float %v has no JSON form", f)
	}
	e := strconv.FormatFloat(f, 'e', -1, 64)
	exp, err := strconv.Atoi(e[strings.IndexByte(e, 'e')+1:])
	if err != nil {
		return nil, err
	}
	if exp < -4 || exp >= 16 {
		return append(b, e...), nil
	}
	s := strconv.FormatFloat(f, 'f', -1, 64)
	b = append(b, s...)
	if !strings.ContainsAny(s, ".") {
		b = append(b, ".0"...)
	}
	return b, nil
}

// Base is the name of the namespace's directory: "<model name, / replaced
// by _>_<digest>", and "_b<block bytes>" after it when sizeSuffix is set
// and the namespace names its block size (kvtier's own format: tiers of
// two block sizes never share files; vLLM's format must keep vLLM's name).
// It holds config.json; the blocks live in RankDir(base, rank).
func (ns Namespace) Base(sizeSuffix bool) (string, error) {
	d, err := ns.Digest()
	if err != nil {
		return "", err
	}
	name := strings.ReplaceAll(ns.ModelName, "/", "_") + "_" + d
	if sizeSuffix && ns.BlockBytes > 0 {
		name += "_b" + strconv.Itoa(ns.BlockBytes)
	}
	return name, nil
}

// RankDir is the directory of one rank's blocks: base + "_r<rank>".
func RankDir(base string, rank int) string { return base + "_r" + strconv.Itoa(rank) }

// RelPath returns where k's block lives below its rank directory:
// <hex[0:3]>/<hex[3:5]>_g<group>/<hex>.bin, hex the lowercase hex of the
// block hash. The hash is hex-encoded, so no key can name a path outside
// the directory.
func RelPath(k offload.Key) string {
	h := k.HexHash()
	// Hashes shorter than 3 bytes give short prefixes; slicing clamps.
	p1, p2 := h[:min(3, len(h))], h[min(3, len(h)):min(5, len(h))]
	var b strings.Builder
	b.Grow(2*len(h) + 24)
	b.WriteString(p1)
	b.WriteByte('/')
	b.WriteString(p2)
	b.WriteString("_g")
	b.WriteString(strconv.FormatUint(uint64(k.Group()), 10))
	b.WriteByte('/')
	b.WriteString(h)
	b.WriteString(".bin")
	return b.String()
}
