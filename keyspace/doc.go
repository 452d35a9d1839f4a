// Package keyspace gives every tenant of a daemon a space of block keys
// of its own, so that two tenants' blocks never collide even when their
// engines compute the same block hashes.
//
// A key in a space is the space's tag followed by the caller's key:
//
//	tag = Marker || be64(ID)        ID = the first 8 bytes of SHA-256("kvtier key space\x00" || name)
//
// The tag is derived from the space's name only, so a block written to a
// persistent tier (a file, an object) stays in its space across restarts
// and configuration changes that keep the name. Keys without a tag are
// the daemon's own (the admin's and every engine's that attaches without
// a tenant token).
//
// The daemon tags every key a tenant sends before anything else sees it,
// and strips the tag from every key it sends back, so a tenant can name
// only keys of its spaces: its own, and the shared spaces the
// configuration gives it. A caller with the admin token sends raw keys
// and could forge a tag; the admin is trusted with every tenant's blocks
// anyway. (The daemon scopes request identifiers too, by the tenant's
// name, so that one tenant cannot finish or read another's request.)
//
// Everything that must attribute a block to a tenant — the primary's
// quotas, the events' extra_keys, the per-tenant metrics — reads the tag
// from the key with IDOf, so no table maps keys to tenants.
package keyspace
