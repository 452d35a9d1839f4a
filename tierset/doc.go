// Package tierset turns the secondary_tiers of a config into tiers: it
// decodes and validates each entry by its type, declares what each tier
// is (name, type, medium, locality) without building it, and builds the
// ordered list of offload.SecondaryTier the tiering manager consults.
//
// Declare is cheap and has no side effects, so `kvtier explain` and config
// checks use it; Build opens connections, directories and goroutines.
//
// Explain answers, for a list of declarations and one request context,
// which tiers the request would load from and store to, and why. The
// filter decisions are offload.TierFilter's own (Allows and Match), the
// same calls the tiering manager makes, so an explanation cannot drift
// from what the manager does.
package tierset
