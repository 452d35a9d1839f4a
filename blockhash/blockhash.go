package blockhash

import (
	"crypto/sha256"
	"errors"
	"fmt"

	"github.com/kvtier/kvtier/offload"
)

// The hash algorithms (vLLM's prefix_caching_hash_algo) this package
// computes. vLLM's xxhash variants are left out: without PYTHONHASHSEED
// each engine process seeds them at random, so no one outside it can
// compute its hashes.
const (
	SHA256     = "sha256"      // pickle, then SHA-256 (vLLM's default)
	SHA256CBOR = "sha256_cbor" // canonical CBOR, then SHA-256
)

// DefaultSeed is what vLLM derives NONE_HASH from when the engine's
// PYTHONHASHSEED is not set.
const DefaultSeed = "vllm-none-hash"

// ErrOptions reports options this package cannot compute hashes for.
var ErrOptions = errors.New("blockhash: invalid options")

// LoRA names a request's LoRA adapter as vLLM's LoRARequest does.
type LoRA struct {
	Name string
	Path string
}

// Options are what a router must know of an engine and a request to
// compute the engine's hashes and keys.
type Options struct {
	// Algo is the engine's prefix_caching_hash_algo ("" = SHA256).
	Algo string
	// Seed is the engine's PYTHONHASHSEED ("" = DefaultSeed).
	Seed string
	// HashBlockSize is the tokens per block hash: the engine's KV-cache
	// block size for most models.
	HashBlockSize int
	// TokensPerKey is the offloading connector's block size in tokens, a
	// multiple of HashBlockSize (0 = HashBlockSize).
	TokensPerKey int
	// CacheSalt is the request's cache_salt ("" = none).
	CacheSalt string
	// LoRA is the request's adapter (nil = none).
	LoRA *LoRA
}

// Hasher computes the block hashes and keys of prompts for one set of
// Options. It is safe for concurrent use.
type Hasher struct {
	o        Options
	cbor     bool
	noneHash []byte
}

// maxBlockTokens bounds HashBlockSize: one block's pickle stays within a
// single pickle frame (each token at most 9 bytes).
const maxBlockTokens = 4096

// maxExtra bounds the salt and the LoRA name and path, so that every
// string stays inside a pickle frame as vLLM's pickler writes it.
const maxExtra = 16 << 10

// New checks o and returns its Hasher.
func New(o Options) (*Hasher, error) {
	if o.Algo == "" {
		o.Algo = SHA256
	}
	if o.Seed == "" {
		o.Seed = DefaultSeed
	}
	if o.TokensPerKey == 0 {
		o.TokensPerKey = o.HashBlockSize
	}
	switch {
	case o.Algo != SHA256 && o.Algo != SHA256CBOR:
		return nil, fmt.Errorf("%w: hash algorithm %q (want %s or %s)", ErrOptions, o.Algo, SHA256, SHA256CBOR)
	case o.HashBlockSize <= 0 || o.HashBlockSize > maxBlockTokens:
		return nil, fmt.Errorf("%w: hash block size %d (want 1..%d)", ErrOptions, o.HashBlockSize, maxBlockTokens)
	case o.TokensPerKey < 0 || o.TokensPerKey%o.HashBlockSize != 0:
		return nil, fmt.Errorf("%w: tokens per key %d is not a multiple of the hash block size %d", ErrOptions, o.TokensPerKey, o.HashBlockSize)
	case len(o.Seed) > maxExtra || len(o.CacheSalt) > maxExtra:
		return nil, fmt.Errorf("%w: seed or cache salt over %d bytes", ErrOptions, maxExtra)
	case o.LoRA != nil && (len(o.LoRA.Name) > maxExtra || len(o.LoRA.Path) > maxExtra):
		return nil, fmt.Errorf("%w: LoRA name or path over %d bytes", ErrOptions, maxExtra)
	}
	h := &Hasher{o: o, cbor: o.Algo == SHA256CBOR}
	h.noneHash = h.hash(o.Seed)
	return h, nil
}

// Options returns the hasher's options, defaults filled in.
func (h *Hasher) Options() Options { return h.o }

// BlockHashes returns the hashes of the full blocks of tokens, in prefix
// order, as vLLM's request block hasher computes them.
func (h *Hasher) BlockHashes(tokens []int64) [][]byte {
	bs := h.o.HashBlockSize
	out := make([][]byte, 0, len(tokens)/bs)
	parent := h.noneHash
	for start := 0; start+bs <= len(tokens); start += bs {
		parent = h.hash(tuple{parent, ints(tokens[start : start+bs]), h.extraKeys(start)})
		out = append(out, parent)
	}
	return out
}

// Keys returns the offload keys of tokens' full chunks in KV-cache group
// group, in prefix order: the keys kvtier holds the prompt's blocks under.
func (h *Hasher) Keys(tokens []int64, group uint32) []offload.Key {
	per := h.o.TokensPerKey / h.o.HashBlockSize
	hashes := h.BlockHashes(tokens)
	keys := make([]offload.Key, 0, len(hashes)/per)
	for i := per - 1; i < len(hashes); i += per {
		keys = append(keys, offload.MakeKey(hashes[i], group))
	}
	return keys
}

// extraKeys is vLLM's generate_block_hash_extra_keys for a block that
// starts at token start: LoRA keys, then the cache salt on the first
// block; nil (None) when there are none.
func (h *Hasher) extraKeys(start int) any {
	var keys tuple
	if h.o.LoRA != nil {
		keys = append(keys, tuple{"lora", h.o.LoRA.Name, h.o.LoRA.Path})
	}
	if start == 0 && h.o.CacheSalt != "" {
		keys = append(keys, tuple{"cache_salt", h.o.CacheSalt})
	}
	if keys == nil {
		return nil
	}
	return keys
}

// hash is vLLM's sha256 or sha256_cbor of v.
func (h *Hasher) hash(v any) []byte {
	var b []byte
	if h.cbor {
		b = appendCBOR(nil, v)
	} else {
		b = pickle(v)
	}
	sum := sha256.Sum256(b)
	return sum[:]
}

// tuple is a Python tuple; ints is a tuple of ints. The other values
// encoded are nil (None), []byte (bytes), string (str) and int64 (int).
type (
	tuple []any
	ints  []int64
)
