// Package tierset turns the secondary_tiers of a config into tiers: it
// decodes and validates each entry by its type, declares what each tier
// is (name, type, medium, locality) without building it, and builds the
// ordered list of offload.SecondaryTier the tiering manager consults.
//
// Declare is cheap and has no side effects, so `kvtier explain` and config
// checks use it; Build opens connections, directories and goroutines.
//
// # Tier types
//
//   - memory: in-process (tiers/memory); medium and locality as configured,
//     dynamic on an axis left out.
//   - fs: a directory (tiers/fs); STORAGE, configured locality.
//   - s3: an S3-compatible bucket (tiers/s3); STORAGE, configured locality.
//   - redis: a Redis or Valkey server (tiers/redis); CPU (remote DRAM),
//     configured locality.
//
// The type-specific keys of an entry are the yaml keys of the tier
// package's Config, decoded over its defaults; every problem Declare finds
// names its key path (secondary_tiers[2].bucket). fs and s3 entries take
// the layout fields they leave unset (model name, block size) from the
// config's namespace, so an fs root and an s3 prefix of one daemon hold
// the same tree. A tier that sets `events: true` while the daemon's
// events are disabled logs one warning when built and emits nothing
// (docs/semantics.md §5.1).
//
// What a tier declares, and the explanation of a request's filters
// against the declarations, are package explain's: the daemon (server)
// explains requests without linking any tier.
package tierset
