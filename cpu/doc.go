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
// With Config.Shares the primary is divided between the owners of key
// spaces (tenants, package keyspace): each owner has a quota of slots, a
// weight and an eviction order of its own, and a store evicts first from
// the owner furthest above its quota, so that an owner within its quota
// never loses a block to another's store (shares.go).
//
// A Primary is not safe for concurrent use: like vLLM's manager it is
// owned by one executor at a time (the tiering manager, serialised by the
// daemon). Its arena, though, is shared with transfer workers and engines,
// which the pin protocol keeps safe.
//
// # Cost
//
// Keys are indexed by an in-house open-addressing hash table over slot
// indices, hashed by a per-instance seeded multiply-mix of the whole key
// (wyhash-style, a few times cheaper than hash/maphash on engine keys);
// per-slot metadata and the policy lists are flat arrays with intrusive
// links, so Lookup, Touch and CompleteLoad do not allocate and each key is
// hashed once per call (twice in PrepareStore with the reuse filter on).
// CompleteStore, and a PrepareLoad of the keys just stored, find their
// slots from the last PrepareStore without hashing; PinSlots and
// UnpinSlots take further pins on slots a caller already holds, so that a
// cascade to several tiers looks its keys up once; PrepareStoreInto
// reuses the caller's output slices.
//
// Fixed metadata per slot is 32 B of state, 8 B of list links (which
// also chain the free slots) and the index buckets, a table sized exactly
// for a load of at most 1/4 with LRU (32 B per slot, 72 B in all) and 2/5
// with ARC (20 B). ARC adds its ghost lists B1 and B2, up to the slot
// count each, as 12-byte entries of one table at load ≤ 3/4: 32 B per
// slot, 92 B in all. BenchmarkMetadata measures 72.1 and 92.2 B per slot
// at 100 000 slots. Key bytes are not counted: they are the caller's
// strings, kept by reference, so do not build keys as substrings of large
// buffers that should be freed.
package cpu
