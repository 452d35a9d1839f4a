// Package peer is kvtier's peer tier (`type: peer`): other kvtier daemons
// as a secondary tier, so that the nodes of a fleet reuse each other's
// prefixes before anyone recomputes them.
//
// # Configuration
//
//	secondary_tiers:
//	  - name: fleet
//	    type: peer
//	    peers:
//	      - {name: node-b, addr: 10.0.0.8:7070, token: …}            # locality derived: remote
//	      - {name: node-c, addr: 127.0.0.1:7071, locality: local}
//	    timeout: 2s          # per call to a peer
//	    event_index: true    # follow the peers' KV events (default)
//	    from_storage: false  # also load what peers hold on their disks
//	    push: false          # cascade stores to peers
//	    index_max_keys: 1048576
//
// addr is the peer daemon's API address (its server.tcp_addr); a peer on
// this host (a loopback address) is local, any other remote, unless
// locality says otherwise.
//
// # Filters per peer
//
// The tier declares neither medium nor locality: the manager asks it for
// every request and the tier applies the request's load filter itself, to
// the medium of the block on the peer (its DRAM: CPU) and the locality of
// the peer. A peer the filter excludes for a request is not contacted for
// that request's keys (Tier.Peers counts the contacts per peer).
//
// # Protocol and its invariants
//
// A peer is asked through its ordinary API, with kv_load_tiers: [] so that
// it answers from its primary alone: a read that arrives from a peer never
// reaches the peer's own secondary tiers, so it is never forwarded to
// further peers (no loops), and a peer only sees the namespace it is asked
// for (the tier's namespace, the same on every node).
//
// # What a peer holds: its events, or a call per step
//
// For a peer that publishes KV events over TCP (events.enabled, bound),
// the tier keeps an index of the blocks in the peer's DRAM (hints.go: a
// bounded lock-free table of 8-byte entries, one writer) and answers
// lookups from it without a call (feed.go). It subscribes to the peer's
// events, passes once over the peer's block list (ListBlocks, which also
// says where the events are and the sequence number of the next batch),
// then applies every batch from that number on: stores add, removals
// drop, a cleared cache empties. The peer's primary announces medium CPU
// without a locality; a CPU tier with one (its Redis tier) is not its
// DRAM and makes no hint; any other medium is its storage. The pass and the events together are
// exact whatever their interleaving, because a page shows the blocks as
// they were when read and every later change is in a later batch. A
// sequence gap is filled from the peer's replay socket; when replay no
// longer has the batches (or the peer has none), the tier passes over the
// block list again. A peer's reset publishes nothing (docs/semantics.md §4.9): loads
// that find indexed blocks gone tell the index, which forgets them.
//
// Whenever the index is not current — no events, the subscription broken,
// a resync under way, more blocks than index_max_keys — the tier asks:
// one batched Lookup per peer per step, on the tier's own goroutine
// (lookups answer Retry until it is back). Either way a HIT is a hint: a
// load that finds the block gone is a miss for the request, never an
// error. Events carry block hashes, never KV data, and travel in plain
// ZMTP even when the API is TLS.
//
// Loads go over the peer's block stream (server/stream.go), through the
// connections of the peer's client (client.StreamPool, which learns the
// stream's port from the peer's Stats): the peer writes each block from its
// pinned slot straight into the socket with its XXH3-64, the tier reads it
// straight into the destination slot and checks size and checksum before
// the job reports it loaded. A peer without a stream (or block_stream:
// false) is read through the API (GetBlocks with checksums). A block damaged
// on the way is rejected, counted (corrupt_blocks) and a miss; a stream
// that fails turns what it had not delivered into misses and the tier uses
// the API until it learns the stream again. Without push the tier is
// read-only (offload.ReadOnly): no cascades, no share of the pin budget.
//
// # Health
//
// A peer that fails unhealthy_after calls in a row is skipped (its keys
// miss) for probe_interval, then tried again: a peer that is down, slow or
// partitioned costs misses within the call timeout, never a stalled step.
//
// # TLS
//
// A peer whose TCP API serves TLS (server.tls) is reached with
// tls: {ca_file, cert_file, key_file, server_name}; with its
// client_ca_file set, only peers presenting a certificate of that CA get
// in (mutual TLS), and the token still applies.
//
// # Push
//
// With push, the manager cascades stores to the tier, and each block goes
// to one peer among those the request's store filter allows (the peer's
// DRAM at its locality) and that are up, chosen by rendezvous hashing, as
// a push on the peer's block stream. The peer keeps a push in its primary
// and lets it cascade with kv_store_tiers [{medium: storage}]: to its
// storage tiers, never to its own peer tiers, so a push never travels
// further.
//
// # From a peer's storage tiers
//
// With from_storage, a block the index says a peer holds in its storage
// tiers (events of medium STORAGE) loads for a request whose filter allows
// storage at the peer's locality: the tier asks the peer with kv_load_tiers
// [{medium: storage}], the peer promotes the block into its primary and
// sends it checksummed. That filter excludes medium CPU, so the peer's own
// peer tiers (DRAM of their peers) are never asked: still no forwarding.
// Storage hints come from the events only (the block list covers the
// DRAM), so they cover what reached a peer's storage since the tier began
// following it.
package peer
