// Package server is the kvtier daemon behind `kvtier serve`: the gRPC API
// of api/kvtier/v1 over a Unix socket and TCP, one tiering manager per
// namespace, the arena side channel for engines on the same host, and
// Prometheus metrics.
//
// # Concurrency
//
// The tiering manager is single-executor, like vLLM's scheduler-side
// offloading manager. Each Namespace therefore owns a mutex and every API
// call holds it for the whole manager interaction, including the copies of
// PutBlocks and GetBlocks (the slots involved are pinned or pending, but a
// concurrent Reset could otherwise recycle them under the copy). Calls of
// different namespaces run in parallel. The daemon never advances engine
// steps on its own: steps end when a client calls ScheduleEnd, except that
// GetBlocks with a wait drives steps between its lookup passes, releasing
// the mutex in between so other clients are served.
//
// # Requests
//
// NewRequest registers a request id per namespace; every per-request call
// names it and an unknown id is NOT_FOUND. FinishRequest marks it finished;
// its id is released once its last pending store completed, because vLLM
// lets completions arrive after the request finished (docs/semantics.md §4.7). A
// finished request may only complete what it started: calls that start
// work for it (Lookup, PrepareLoad, PrepareStore, PutBlocks, GetBlocks)
// are FAILED_PRECONDITION: the tiers may have dropped its state already.
//
// # Sessions
//
// Every client connection is a session (a gRPC stats handler tags it), and
// request ids are scoped to it: two engines may both call their request
// "req-1". A session owns the requests it creates and, through them, the
// pins (PrepareLoad) and reservations (PrepareStore) they hold. When the
// connection ends — close, crash, or a keep-alive the peer misses — each
// of its requests is released exactly once: pins dropped, reservations
// abandoned (slots freed, nothing cascaded), the request finished. A
// session's kv_transfer_params are bounded per session and in total
// (limits.max_session_params_bytes, limits.max_params_bytes_total).
//
// A request no call has named for limits.request_idle_timeout expires.
// One that holds nothing is released; one whose connected client still
// holds pins or reservations is only finished (later calls that start work
// say it expired): the client may still be reading or writing those slots
// through the shared arena, so they are freed by its completions or by the
// end of its session, never under it.
//
// # Reset
//
// Reset drops every block no one holds. A block a session has pinned or
// reserved, and one a tier job is reading or writing, keeps its slot and
// its claims, so a Reset under running clients never hands a slot in use
// to another store and no stale write can land in someone else's block.
// Requests survive a Reset; the tiers' queued jobs are answered as failed.
//
// # Arena side channel
//
// gRPC cannot carry file descriptors, so next to the API's Unix socket the
// daemon listens on a second Unix socket (the API socket's path with
// ".arena" appended, created 0600) that passes the arena's descriptor with
// SCM_RIGHTS: the client sends a namespace name and a newline, the server
// answers one message whose bytes are a JSON description and whose
// ancillary data carries the descriptor, then closes the connection.
//
// # Callers and tenants
//
// Every call is the admin's or one tenant's, told apart by its bearer
// token (tenants.go). A tenant reaches only its namespaces and shared
// spaces (others answer PERMISSION_DENIED before their existence is
// checked) and only the copying calls; its keys are put into its key
// space (package keyspace) and its request ids prefixed with its name
// before a Namespace sees them, and keys go back to it stripped and
// filtered to its own. The namespace's primary divides its slots between
// the tenants' spaces by their quotas (cpu.Share).
//
// # Shutdown
//
// Shutdown stops accepting calls, lets in-flight calls finish (bounded by
// its context), then closes each namespace: the manager drains its tiers'
// jobs (every pin released, every job answered), the last events are
// published and the event sink is flushed, and the sockets are removed.
package server
