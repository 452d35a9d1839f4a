// Package region serves vLLM tier mode: kvtier as one out-of-tree
// secondary tier of vLLM's TieringOffloadingManager, with kvtier's own
// tiers (fs, s3, redis, memory) behind it.
//
// An engine registers its region — the shared-memory file vLLM's CPU
// primary lives in — by passing its descriptor and its Layout; the
// service maps it and binds it to a namespace named after the layout
// (Layout.Namespace), so that engines never read bytes written under
// another layout and engines with the same layout share blocks. Each
// namespace has one tiering.Stack of the daemon's configured tiers: the
// same mechanism the primary-backed manager drives, here driven over the
// engines' regions, each job addressing its own engine's region.
//
// Lookups run over the tiers the request's load filter allows, in order;
// the tier that answered Hit is remembered, and the request's promotion
// jobs load from it. A store job fans out to every tier the store filter
// allows (none: answered at once). Each engine job is answered exactly
// once, with the keys a partial promotion did load; the engine keeps its
// slots pinned or reserved until then, so the stack pins nothing itself.
// The namespace's tier events go to every region of the namespace, for
// its engine to publish (the daemon's own publisher is not used).
//
// Invariants: no tier touches a region after the job using it has been
// answered; a region is unmapped only once none of its jobs is in flight
// (a region whose transfers outlive Config.CloseWait stays mapped and is
// logged, never unmapped under a transfer); every request a region names
// is finished when the engine says so or when the region closes.
//
// Concurrency: the Service and Region methods are safe for concurrent
// use. Each namespace runs one executor goroutine that owns its stack and
// request state; calls hand it closures, and while work is pending it
// polls the tiers every Config.Tick (their results, their step end, which
// flushes asynchronous lookups, and their events).
package region
