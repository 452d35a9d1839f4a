// Package explain says which secondary tiers one request would load from
// and store to, and why: `kvtier explain`, the API's Explain call and the
// tier labels of the daemon's metrics.
//
// A tier is known here by its Declaration (name, type, medium, locality)
// and its Details (read-only; the parts a composite tier such as the peer
// tier lets the filter judge one by one, through the Composite interface).
// Declarations come from a built tier (DeclarationOf, DetailsOf) or from a config
// before anything is built (tierset.Declare).
//
// Explain's filter decisions are offload.TierFilter's own (Allows and
// Match), the calls the tiering manager makes, so an explanation cannot
// drift from what the manager does. The package depends on offload only,
// so that the daemon explains requests without linking the tiers, their
// SDKs and clients.
package explain
