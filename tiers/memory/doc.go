// Package memory is kvtier's in-process secondary tier (docs/semantics.md §5.5): a map
// of block bytes with an optional LRU capacity, configurable medium and
// locality, and knobs that make it a useful stand-in for slow or flaky
// real tiers in tests and simulations: per-job latency (jobs complete on a
// goroutine), deterministic failure injection and an asynchronous lookup
// mode that answers Retry until the next step.
//
// Unlike upstream's example tier, which records only key presence, this
// tier copies the real bytes between the job's arena slots and its own
// storage, so end-to-end data integrity can be tested through it.
//
// With tenants' quotas (Config.Shares, from quota.tiers) its capacity is
// divided between them by package quota's rule (shares.go).
//
// In the config file a memory tier is a secondary_tiers entry of type
// memory; package tierset decodes and validates its keys into a Config.
//
// A memory tier that declares an unspecified medium or locality is dynamic
// on that axis: the tiering manager then always consults it, and the tier,
// having no real placement of its own, serves every request.
package memory
