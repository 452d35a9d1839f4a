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
// for (the tier's namespace, the same on every node). Existence is one
// batched Lookup per peer per step, on the tier's own goroutine (lookups
// answer Retry until it is back); a HIT is a hint, believed for as long as
// a request references the key: a load that finds the block gone is a miss
// for the request, never an error.
//
// Loads go over the peer's block stream (server/stream.go), whose port the
// tier learns from the peer's Stats: the peer writes each block from its
// pinned slot straight into the socket with its XXH3-64, the tier reads it
// straight into the destination slot and checks size and checksum before
// the job reports it loaded. A peer without a stream (or block_stream:
// false) is read through the API (GetBlocks with checksums). A block damaged
// on the way is rejected, counted (corrupt_blocks) and a miss; a stream
// that fails turns what it had not delivered into misses and the tier uses
// the API until it learns the stream again. The tier is read-only
// (offload.ReadOnly): no push, so no cascades.
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
// Not yet: discovery through the peers' KV event streams (existence is
// asked), serving from a peer's own secondary tiers, and PutBlocks /
// GetBlocks of remote engines on the block stream.
package peer
