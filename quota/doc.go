// Package quota divides a capacity — a primary's slots, an fs tier's
// bytes, a memory tier's blocks — between the owners of key spaces (a
// daemon's tenants, package keyspace), for the caches that evict by owner.
//
// Owner 0 is the pool of untagged keys and of spaces no share names; its
// quota is what the shares leave. Each share has a quota and a weight.
// When a store must evict, the cache asks Victim, one victim at a time,
// which owner to take it from: the one furthest above its quota — (held −
// quota) / weight, largest first — that still has a candidate, and only
// when none is above its quota the storer itself. So an owner holding no
// more than its quota never loses a block to another owner's store, an
// owner above it is evicted down to exactly its quota, and capacity no
// one claims is lent to whoever stores rather than kept empty.
//
// A Table is not safe for concurrent use; its caches call it under their
// own lock.
package quota
