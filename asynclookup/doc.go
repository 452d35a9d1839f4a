// Package asynclookup batches existence checks for secondary tiers whose
// "is this key stored?" question costs a system call or a round trip (the
// filesystem, S3, Redis). It follows vLLM's AsyncLookupManager
// (docs/semantics.md §5.6):
//
//   - The first Lookup of a key answers offload.Retry and queues the key
//     for this step's batch; the tier keeps answering Retry until a verdict
//     arrives.
//   - Flush, called from the tier's OnScheduleEnd, posts everything queued
//     during the step as one batch to the manager's worker goroutine, which
//     calls the tier's BatchFunc (in chunks of at most Options.MaxBatch
//     keys). A failing BatchFunc turns the whole chunk into misses.
//   - Verdicts are shared by every request that asked about the key and are
//     kept while some request still references the key; Cleanup drops a
//     finished request, and a key nobody references is forgotten, so a
//     later request probes again.
//   - MarkMiss records a failed load: every request that currently
//     references the key answers Miss for it from then on without probing
//     again (the livelock fix of vLLM #49328), while the shared verdict is
//     dropped so that a fresh request probes afresh.
//
// Each verdict carries a generation number; a verdict that arrives for a
// key whose state was dropped or recreated in the meantime is discarded.
//
// Lookup, Flush, MarkMiss, Forget, Cleanup and Pending may be called from
// any goroutine, but are meant for the tier's single executor; the worker
// goroutine only touches shared state under the manager's mutex.
package asynclookup
