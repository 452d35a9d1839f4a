// Package client is the Go client of the kvtier daemon's API
// (api/kvtier/v1): Dial a Unix socket or a TCP address, then call the
// batched manager calls, the by-value PutBlocks/GetBlocks, or MapArena to
// read and write the daemon's slot memory directly from the same host.
//
// Over TCP, PutBlocks and GetBlocks move their blocks on the daemon's block
// stream (byvalue.go) when it offers one: straight between the caller's
// buffers and the socket, each block checksummed, with the API's answers
// (filters, wait, refusals); Options.NoStream keeps them on the API.
// Stream is that connection for callers that drive it themselves.
//
// A Client is safe for concurrent use. The daemon serialises calls per
// namespace, so concurrent calls on one namespace are applied one at a
// time in arrival order.
package client
