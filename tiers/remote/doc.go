// Package remote is the machinery shared by kvtier's remote secondary
// tiers (tiers/s3 and tiers/redis): the integrity envelope every block is
// stored in, a health tracker that turns a dead server into fast misses
// and recovers by itself, the job bookkeeping that answers every
// submitted job exactly once, and Base, which puts these together with
// the asynchronous existence checks into everything a remote tier does
// that does not depend on its backend.
//
// # Envelope
//
// A block is stored as a 32-byte header followed by the slot bytes:
//
//	0  4  magic "KVTB"
//	4  1  version (1)
//	5  3  reserved, zero
//	8  8  payload length, big endian
//	16 8  XXH3-64 of the payload, big endian
//	24 8  XXH3-64 of the offload key, big endian
//
// A reader checks the magic, version and key checksum before it trusts the
// length, and the length and payload checksum before the block is exposed
// (docs/design.md §5). The key checksum catches a value stored under the wrong
// name; the payload checksum catches truncation, bit rot and a value that
// changed underneath a reader. XXH3 hashes a 2 MiB block in tens of
// microseconds, about six times faster than xxhash64 on these machines, so
// verification costs little next to the transfer.
//
// # Health
//
// Health counts consecutive transport failures. At a threshold the tier
// is marked down: lookups answer Miss without touching the network,
// stores and loads fail at once, and a background goroutine probes the
// server until it answers again. No caller ever waits for a probe.
//
// # Jobs
//
// Each submitted job runs on its own goroutine (bounded by a maximum
// number in flight; beyond it the job fails at once); the results are
// collected for FinishedJobs, DrainJobs waits for quiescence, and Close
// answers the jobs that did not finish in time as failed.
//
// # Base
//
// A tier embeds a *Base and supplies only its backend: the batched
// existence check, a StoreFunc and a LoadFunc. Base answers the manager:
// lookups through package asynclookup, gated by Health; submissions,
// refused at once while the server is down; job results, with the
// counters, the stored events, and the verdicts that finished jobs
// change (a stored key is probed again, a key that failed to load is a
// Miss for the requests that asked for it). Shared and ParseLocality
// check the config keys every remote tier has.
//
// # Budget
//
// With max_bytes a tier keeps a ledger of the blocks it wrote (Budget):
// listed from the server at startup, a store admitted only with room,
// made by deleting victims first — divided between tenants by package
// quota's rule, so that a tenant within its quota never loses a block to
// another's store on a server that knows nothing of tenants.
package remote
