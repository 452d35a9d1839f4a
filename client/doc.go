// Package client is the Go client of the kvtier daemon's API
// (api/kvtier/v1): Dial a Unix socket or a TCP address, then call the
// batched manager calls, the by-value PutBlocks/GetBlocks, or MapArena to
// read and write the daemon's slot memory directly from the same host.
//
// A Client is safe for concurrent use. The daemon serialises calls per
// namespace, so concurrent calls on one namespace are applied one at a
// time in arrival order.
package client
