// Package events turns kvtier's offloading events into the KV events that
// vLLM publishes, so that KV-aware routers (llm-d, Dynamo, vLLM's own
// examples) can consume kvtier exactly as they consume an engine
// (docs/semantics.md §6).
//
// Three layers, usable separately:
//
//   - Tracker translates []offload.Event into BlockStored / BlockRemoved
//     wire events (§6.3): placeholder events by default, self-describing
//     events (token ids, parent hash, per-hash-block hashes) for keys whose
//     token metadata the engine attached with Tracker.Record.
//   - Format encodes wire events as msgpack exactly as vLLM's msgspec
//     encoder does (§6.4): the batch is [ts, events, dp_rank], events are
//     maps tagged by "type" with defaults omitted (or, optionally, the
//     older positional arrays). Encoding appends to caller-owned buffers
//     and does not allocate per event.
//   - Publisher sends batches over ZMQ (§6.5): a PUB socket with topic and
//     an 8-byte big-endian sequence, a bounded queue that drops the oldest
//     batch when full (leaving a sequence gap), and a ROUTER replay
//     endpoint. The ZMQ wire protocol comes from package events/zmtp, a
//     small pure-Go ZMTP 3 implementation with a queue per subscriber, so
//     that a stalled subscriber cannot starve a healthy one and a clean
//     shutdown delivers what is queued.
package events
