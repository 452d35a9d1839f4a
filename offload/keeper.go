package offload

// Keeper is implemented by tiers that choose their own victims to stay
// under a capacity (fs and memory tiers, redis and s3 with max_bytes).
// The manager hands such a tier, once before its first job, what routers
// and agents pinned (pins with a TTL): while keep(k) reports true the
// tier never chooses k's block as a victim; a store that finds no other
// victim fails (its blocks stay in the primary) rather than evict it.
// keep is safe for concurrent use and cheap: tiers call it while they
// scan for victims. A tier's server that evicts by itself (a Redis
// maxmemory policy, an object store's lifecycle rules) is beyond it.
type Keeper interface {
	Keep(keep func(Key) bool)
}
