// Package redis is kvtier's Redis/Valkey secondary tier (`type: redis`,
// docs/design.md §5): a shared remote-DRAM tier, medium CPU, locality from
// config (usually remote) — the "remote CPU" tier of the filter examples.
//
// # Configuration
//
//	secondary_tiers:
//	  - name: remote-dram
//	    type: redis
//	    addr: 10.0.0.7:6379          # required
//	    password: …                  # optional; username for ACLs
//	    db: 0
//	    tls: {ca_file: ca.pem}       # optional; cert_file + key_file, server_name
//	    key_prefix: "llama3-8b:"      # default (from a config file) kvtier:<model>:<bytes_per_block>:
//	    ttl: 30m                     # optional expiry, refreshed by Touch
//	    max_value_bytes: 536870912   # envelope included
//	    pool_size: 16                # concurrent transfer pipelines
//	    dial_timeout: 2s
//	    timeout: 5s                  # per command or pipeline attempt
//	    lookup_timeout: 1s           # per existence-check pipeline
//	    retries: 2
//	    retry_backoff: 20ms
//	    keyspace_events: true        # report server evictions/expiries
//	    locality: remote
//	    events: true
//
// Invalid values are errors naming the key. New pings the server: an
// unreachable server (ErrUnreachable) or a refused login fails startup.
//
// With tls every connection — go-redis' and the tier's own, to every node
// of a cluster — negotiates TLS: ca_file is trusted (default: the
// system's roots), cert_file and key_file are presented to a server that
// requires client certificates (tls-auth-clients), server_name is checked
// instead of the host dialled. A server that speaks TLS to a tier that
// does not (or the reverse) fails startup. Blocks carry what prompts
// computed; a store shared across hosts should not see them in the clear.
//
// # Redis Cluster and Valkey cluster
//
//	cluster: true
//	addrs: [10.0.0.7:7000, 10.0.0.8:7000, 10.0.0.9:7000]   # seed nodes
//
// With cluster: true the tier routes every block itself, on a slot map it
// reads with CLUSTER SLOTS (package slotmap): keys spread over the 16384
// slots (no hash tags, so one job's blocks land on several masters), a
// job's blocks are split per master and sent to the masters concurrently,
// MOVED and ASK redirections are followed (by go-redis' cluster client,
// which shares the tier's map). db must be 0.
//
// Health is tracked per master: transport failures on one master count
// toward that master only (unhealthy_after in a row mark it down, a
// probe every probe_interval brings it back), and while it is down its
// keys answer Miss, its blocks are neither loaded nor stored (counted in
// kvtier_tier_node_down_blocks_total; a cascade's other blocks are stored
// and the refused ones count as tier_down drops), and no I/O waits on it
// — the other masters' blocks keep hitting and storing. The tier as a
// whole is down only while no node answers CLUSTER SLOTS.
//
// The slot map is read every probe_interval, at once (at most every
// 100ms) after a MOVED or ASK reply or a connection failure, and every
// 100ms while a master is down, from the healthy masters first, then the
// seeds and replicas: after a failover the promoted replica serves the
// dead master's keys within a reload of the cluster's own promotion
// (BENCHMARKS.md measures it), and kvtier_tier_slot_map_changes_total
// counts the changes followed. Blocks the dead master acknowledged but
// had not replicated are lost with it: they load as misses, never as
// other bytes. A cluster that is a cache should run with
// cluster-require-full-coverage no: by default every master refuses
// every key (CLUSTERDOWN) from the moment the cluster marks a master
// failed until a replica is promoted, about a second, and no client can
// serve the other masters' keys meanwhile.
//
// Keyspace notifications are local to the node that holds a key, so with
// keyspace_events the tier sets the flags on every node (replicas
// included, so that a promoted replica already publishes) and subscribes
// on every master; a new master (a promoted replica) gets a subscription
// and a reconciliation pass, since removals during the failover were not
// seen, and a former master loses its subscription.
// kvtier_tier_node_healthy{node} in /metrics is each master's health.
// Production clusters keep the default cluster-replica-validity-factor;
// an idle test cluster needs 0 to fail over.
//
// # Keys and values
//
// A block is stored under <key_prefix><hex hash>:<group> as a 32-byte
// kvtier envelope (package tiers/remote: magic, length, XXH3-64 of the
// payload and of the key) followed by the block bytes.
//
// # Behaviour
//
//   - Lookup is asynchronous (package asynclookup): the first lookup of a
//     key answers Retry; at OnScheduleEnd the step's keys are checked in
//     one pipeline of EXISTS, and later lookups answer Hit or Miss.
//   - A store job is one pipeline of SET (with PX ttl when configured)
//     per master, and a load job one pipeline of GET per master, on the
//     tier's own connections (package slotpipe): a SET's header and
//     block go out in one vectored write straight from the slot as far
//     as the socket takes them at once, the rest is copied and sent in
//     the background, so a slot is read, and claimed, only at memory
//     speed, however slow the server; a GET's value is read by the kernel
//     into a header buffer and the slot, and verified there. Keys that
//     path left without an answer — a MOVED or ASK after a resharding or
//     failover, an error reply, a connection that failed — go again
//     through the go-redis client (values sealed into a buffer, replies
//     verified before they are copied), which follows redirections; a
//     failure on the wire counts as the first of the job's attempts
//     (retries), an answered error does not.
//   - GET returns one consistent value; the tier verifies the envelope
//     (key, length, checksum) before it reports a block loaded, so a
//     value that vanished (reads as missing) or changed underneath
//     (fails the checksum) is never served; the slot of a block that
//     fails holds whatever was read, and the primary never exposes the
//     slot of a failed load. A corrupt value is a Miss for the request,
//     is counted, and is deleted by a script that deletes it only if it
//     still holds the bytes read — a good value written since is kept.
//   - A failed load marks its keys Miss for the request; a partially
//     failed load reports the loaded prefix.
//   - Commands have a timeout; transient failures are retried with
//     backoff. After unhealthy_after consecutive transport failures the
//     tier (in a cluster: the master that failed, see above) is
//     unhealthy: lookups answer Miss at once, cascades and loads fail at
//     once and are counted as skipped, and a background PING marks it
//     healthy again when the server answers (re-enabling keyspace events,
//     which a restarted server has forgotten).
//   - Touch refreshes the TTL (PEXPIRE) or, without one, the LRU clock
//     (TOUCH) of the blocks in the background.
//
// # Capacity and removed events
//
// Capacity is the server's: set maxmemory and an eviction policy
// (allkeys-lru suits a cache). With keyspace_events the tier enables the
// E, g, x and e classes of notify-keyspace-events (CONFIG SET; existing
// flags are kept) and subscribes to __keyevent@<db>__:evicted, :expired
// and :del. Every such key under the tier's prefix becomes a removed
// event (medium CPU, the tier's locality) and drops the key's cached
// lookup verdict. Where CONFIG is not allowed (many managed services) the
// tier logs that keyspace events are off; configure the flags on the
// service instead. Without notifications, blocks the server drops are not
// reported by notifications and the next lookup of them answers Miss. A
// FLUSHDB or FLUSHALL, a restart of a server without persistence and a
// subscription that is down for a while drop blocks without per-key
// events.
//
// Reconciliation closes those gaps: the tier remembers the keys it
// announced stored (bounded; beyond the bound the oldest are published as
// removed) and, after every recovery from an outage, every
// (re)subscription of the keyspace events and every reconcile_interval
// (default 10m), checks them against the server with pipelined EXISTS at
// most reconcile_rate keys per second (default 5000), publishing the
// removal of each key the server no longer holds. What the tier announced
// is what the server holds again after any outage. Only announced keys'
// removals are published, once each. Checking the announced keys rather
// than SCANning the server costs in proportion to what this tier wrote,
// not to what a shared server holds.
//
// Events (when enabled): one stored event per fully successful store job,
// removed events as above, and a removed event for a corrupt value the
// tier deleted when no notification will report it.
package redis
