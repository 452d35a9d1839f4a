// Package cpu provides kvtier's primary tier: a slot arena in CPU memory
// and the block bookkeeping of vLLM's CPU offloading manager (spec
// §3.1–§3.4) — block states and reference counts, lookup, load pins,
// stores with eviction, events and stats — with an LRU or ARC policy.
//
// A block is PENDING (ref −1) from PrepareStore until CompleteStore,
// READY and evictable at ref 0, and pinned by readers at ref > 0. Only
// ready, unpinned blocks that are not part of the current store call are
// ever evicted, and eviction is all-or-nothing.
//
// Used without secondary tiers, the primary can also apply vLLM's reuse
// filter (Config.StoreThreshold): only keys looked up often enough are
// stored.
//
// A Primary is not safe for concurrent use: like vLLM's manager it is
// owned by one executor at a time (the tiering manager, serialised by the
// daemon). Its arena, though, is shared with transfer workers and engines,
// which the pin protocol keeps safe.
//
// # Cost
//
// Keys are indexed by an in-house open-addressing hash table over slot
// indices; per-slot metadata and the policy lists are flat arrays with
// intrusive links, so Lookup, Touch and CompleteLoad do not allocate and
// each key is hashed once per call. Fixed metadata per slot is 32 B of
// state, 8 B of list links, 4 B of free list and 16–32 B of index buckets
// (load ≤ 1/2, rounded to a power of two): 60–76 B for LRU, 65 B measured
// at 100 000 slots. ARC adds ghost lists of up to twice the slot count at
// 16 B per ghost plus 21–43 B of ghost buckets per slot (139 B per slot
// measured in all). Key bytes are not counted: they are the caller's
// strings, kept by reference, so do not build keys as substrings of large
// buffers that should be freed.
package cpu
