// Package workload replays request traces through kvtier's tiers so that
// researchers can size tiers and compare policies and per-request filters
// (`kvtier bench`), in the spirit of pebble's workload tools.
//
// A trace is the Mooncake format (kvcache-ai/Mooncake, FAST'25 release):
// one JSON object per line with timestamp (ms), input_length and
// output_length (tokens) and hash_ids, one id per 512-token block, where
// equal ids across requests are a reusable prefix. Reader parses it as a
// stream, with line-numbered errors and bounds on line length and ids per
// request, so that a malformed or hostile file yields an error, never a
// panic or an unbounded allocation.
//
// Replay drives the real stack — a cpu.Primary, the secondary tiers that
// tierset builds from a config, and a tiering.Manager — the way a vLLM
// connector would: for each request in order it looks the request's keys
// up as a prefix, steps the manager until promotions from secondary tiers
// have settled, loads the hit prefix, stores the missing blocks, touches
// the request's blocks and finishes the request. It reports the prefix hit
// rate (matched leading blocks over all blocks), which tier served the
// hits, evictions, cascades and throughput.
//
// The requests of a trace run back to back, one engine step after another:
// there is no concurrency between requests and timestamps are not honoured,
// so the figures describe cache behaviour and manager cost, not latency
// under load.
package workload
