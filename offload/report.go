package offload

// Reporter is implemented by secondary tiers that keep figures of their
// own beyond what the stack counts for every tier (occupancy, evictions,
// corrupt blocks, the health of the servers they talk to). The daemon
// shows them in its stats and /metrics without knowing the tier's type.
type Reporter interface {
	Report() TierReport
}

// TierReport is what a tier says about itself. Zero counters mean
// "none"; OccupancyBlocks and OccupancyBytes are -1 when the tier does not
// know them.
type TierReport struct {
	// OccupancyBlocks is the number of blocks the tier holds and
	// OccupancyBytes their size; Evictions counts the blocks it (or its
	// server) evicted.
	OccupancyBlocks, OccupancyBytes int64
	Evictions                       uint64
	// CorruptBlocks counts blocks that failed verification when read and
	// CorruptDeleted those the tier then deleted.
	CorruptBlocks, CorruptDeleted uint64
	// Remote holds the figures of a tier with a notion of server health;
	// nil for a tier that is always healthy.
	Remote *RemoteReport
	// Shares are the bytes each tenant's key space holds in a tier whose
	// capacity is divided between tenants, and its quota; nil otherwise.
	Shares []ShareReport
}

// ShareReport is one key space's part of a tier (Space 0: the untagged
// pool).
type ShareReport struct {
	Space        uint64
	Bytes, Quota int64
}

// UnknownOccupancy is a TierReport with no occupancy known.
func UnknownOccupancy() TierReport { return TierReport{OccupancyBlocks: -1, OccupancyBytes: -1} }

// RemoteReport are the figures of a tier that talks to servers.
type RemoteReport struct {
	// Healthy is false while the server is considered down (for a tier
	// of several servers: while none is up): lookups then miss and jobs
	// fail without being tried.
	Healthy bool
	// LookupsUnhealthy counts lookups answered Miss without asking
	// because the server was down.
	LookupsUnhealthy uint64
	// LoadJobsSkipped and StoreJobsSkipped count jobs refused at
	// submission without any I/O: server down, tier closed, or too many
	// jobs in flight.
	LoadJobsSkipped, StoreJobsSkipped uint64
	// ReconciledRemovals counts removals published late, by a
	// reconciliation pass, for blocks the server dropped unseen (a
	// subscription down, a restart that lost the data, a lifecycle rule);
	// ReconcileFailures the passes that could not finish.
	ReconciledRemovals, ReconcileFailures uint64
	// Nodes are the servers of a tier of several (a cluster's masters, a
	// peer tier's peers) and whether each is up; empty for one server.
	Nodes []NodeReport
	// NodeDownBlocks counts blocks a clustered tier neither loaded nor
	// stored nor looked up, without I/O, because the master of their slot
	// was down; SlotMapChanges the slot maps it read that differed from
	// the previous one (failovers, reshardings).
	NodeDownBlocks, SlotMapChanges uint64
	// StoresFull counts the store jobs a tier with max_bytes refused for
	// lack of room: its quotas left the storer nothing to evict.
	StoresFull uint64
}

// NodeReport is one server of a tier of several.
type NodeReport struct {
	Addr    string
	Healthy bool
	// Index is a peer tier's event index of the peer (nil otherwise).
	Index *NodeIndex
}

// NodeIndex is the state of a peer tier's index of one peer.
type NodeIndex struct {
	Current      bool // lookups are answered from it
	Blocks, Gaps int64
}
