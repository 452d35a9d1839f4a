// Package offload is kvtier's vocabulary: offload keys, media, localities,
// the per-request tier filters parsed from kv_transfer_params, request
// contexts, lookup results, events, transfer jobs, and the SecondaryTier
// contract that every secondary tier implements.
//
// The package does no I/O. Its semantics follow docs/semantics.md §1–§2
// (vLLM kv_offload tiering and PR #48123 tier filtering) plus the
// extensions of docs/design.md §3: kv_store_tiers, server default filters and
// strict validation.
//
// The filter check TierFilter.Allows sits on the lookup hot path, once per
// secondary tier per block, so it is precomputed at parse time into a
// bitmask over the 3×3 medium×locality combinations.
//
// In lenient mode a Parser reports every filter problem through
// OnWarning; a WarningLog plugged in there logs each distinct message at
// most once per interval and counts warnings by reason for metrics.
package offload
