// Package blockhash computes, from a prompt's token ids, the block hashes
// vLLM 0.33 computes for prefix caching and the kvtier keys its offloading
// connector derives from them. A router or an agent framework can then ask
// a daemon about a prompt (Residency, Prefetch, Pin, Delete) before any
// engine has seen it.
//
// vLLM hashes a prompt one block of hash_block_size tokens at a time (the
// KV cache's block size for most models), each hash covering the whole
// prefix up to its block:
//
//	hash(i) = H((hash(i-1), tuple(tokens of block i), extra_keys(i)))
//	hash(-1) = NONE_HASH = H(seed)
//
// H serializes its argument with pickle (protocol 5) for "sha256", the
// default prefix_caching_hash_algo, or with canonical CBOR for
// "sha256_cbor", and takes the SHA-256 of the bytes. The seed is the
// engine's PYTHONHASHSEED when it is set, else "vllm-none-hash". The
// extra keys are, in this order: ("lora", name, path) on every block of
// a LoRA request, then ("cache_salt", salt) on the first block of a
// salted request; None when there are none. Multimodal inputs and prompt
// embeddings add keys a router cannot know from token ids, so they are
// not supported.
//
// The offloading connector keeps one key per chunk of tokens_per_key
// tokens (its offloaded block size, a multiple of hash_block_size): the
// hash of the chunk's last block followed by the KV-cache group index as
// 4 big-endian bytes (offload.MakeKey). A partial chunk has no key.
//
// Pickle writes an object it has written before as a reference to it, so
// vLLM's hashes depend on which strings are the same object. This package
// takes the salt and the LoRA name and path as distinct objects, as
// strings decoded from a request are, except where CPython shares one
// object for every equal string: the empty string and one-character
// strings below U+0100.
//
// The package is tested byte for byte against the installed vLLM's own
// hashing (python/tests/test_keys.py, through `kvtier keys`).
package blockhash
