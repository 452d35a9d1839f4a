// Package tiering is kvtier's multi-tier offloading manager (docs/semantics.md §4): it
// stacks an ordered list of secondary tiers behind the CPU primary tier,
// answers lookups primary-first, promotes blocks found in a secondary tier
// into the primary, cascades stored blocks from the primary down to the
// secondary tiers, and drives the tiers' jobs step by step.
//
// The manager, not the tiers, enforces each request's tier filters: the
// load filter decides which tiers a lookup may ask (a tier it excludes is
// not called at all), the store filter decides which tiers receive the
// cascade of the request's stored blocks. The check is one bit test per
// tier against the tier's declared medium and locality, read once when
// the manager is built.
//
// The ordered stack of secondary tiers is its own type, Stack: filter
// enforcement, job ids and outcomes, panic recovery, admission and the
// cascade pin budget. The Manager is the CPU primary plus a Stack and
// drives it through the Driver interface; vLLM tier mode drives the same
// Stack over an engine's arena.
//
// Every transfer between the primary and a tier is a job with a unique id.
// A cascade pins its source blocks in the primary until the tier answers,
// once per tier job (ref == number of tiers); only the first job looks the
// keys up, the others pin the same slots by index, and the jobs of one
// cascade share their Keys and Slots slices, which tiers only read;
// a promotion reserves its target slots (pending) until the tier answers.
//
// A secondary tier never makes the cache worse than the primary alone.
// Cascade pins are soft (cpu.Primary.PinSoft): a block keeps its place in
// the eviction order, and when eviction reaches one held only by cascades
// the primary asks Stack.Revoke, so that the block is evicted where the
// primary alone would have evicted it. A tier that claims each block
// while it reads its slot (offload.BlockClaimer: fs, memory, s3, redis)
// gives that one block back, queued or running, unless it is copying it
// at that moment; the job goes on with its other blocks. Other tiers'
// jobs are withdrawn whole while still queued (offload.JobQueue). A read
// in progress is never torn. A pin budget (BudgetConfig) bounds the slots
// the cascades in flight pin, in all and per tier; a cascade that does
// not fit waits, unpinned, in a bounded queue and goes when the budget
// frees if its blocks are still in the primary (stack_defer.go); one the
// queue cannot take, or that a tier refuses (offload.ErrRefused), is
// dropped and counted by DropReason. A job's latency runs from its submission to its result,
// so back-pressure sees the time jobs wait in a tier's queue.
// The manager matches every pin with one unpin and resolves every reserved
// slot, on success, failure, reset and shutdown alike, and it survives
// tiers that misbehave: a tier call that panics is recovered and counted
// as a miss or a failed job, and results for jobs the manager does not know
// are logged and counted.
//
// Like vLLM's manager, completions are polled at most once per engine step
// (the first of Lookup, PrepareStore or ScheduleEnd in a step polls), and
// promotions found during a step are batched per (tier, request) and
// submitted at ScheduleEnd.
//
// A Manager is single-executor: it is not safe for concurrent use, and the
// daemon serialises calls to it. Tiers do their I/O on their own
// goroutines.
//
// Files: manager.go (the Manager, its requests and steps),
// manager_lookup.go (lookups, promotions, loads), manager_store.go
// (stores, leases); stack.go (the Stack and its tiers), stack_lookup.go
// (lookup and promotion), stack_cascade.go (cascades and their budget),
// stack_defer.go (cascades waiting for the budget), stack_jobs.go (job
// results, once per step), stack_revoke.go (taking cascade pins back for
// eviction); admission.go and budget.go (what a
// cascade may pin and when it is dropped), safe.go (tier calls that
// panic), stats.go and histogram.go.
package tiering
