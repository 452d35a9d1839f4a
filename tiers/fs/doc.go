// Package fs is kvtier's filesystem secondary tier (docs/semantics.md
// §5.1): medium STORAGE, locality from the configuration, one file per
// block in vLLM's on-disk layout so that vLLM's own FS tier and kvtier can
// share a directory.
//
// Layout. The namespace fields (model, tokens per hash, blocks per file,
// parallel sizes, dtype, KV-cache groups, inference engine) are rendered
// as Python's json.dumps(sort_keys=True, separators=(",",":")) renders
// them; the first 12 hex digits of their sha256 name the directories:
//
//	<root>/<model with / → _>_<digest>/config.json
//	<root>/<model with / → _>_<digest>_r<rank>/<hex[0:3]>/<hex[3:5]>_g<group>/<hex>.bin
//
// where hex is the lowercase hex of the block hash (never a raw key, so no
// key can traverse out of the directory).
//
// Formats. With format "kvtier" (the default) a block file is the block's
// bytes followed by a 24-byte trailer, all integers little-endian:
//
//	offset  size  field
//	0       4     magic "KVTB"
//	4       2     version (1)
//	6       2     checksum algorithm (1 = XXH3-64 seeded with XXH3-64 of the key)
//	8       8     payload length in bytes
//	16      8     checksum of the payload
//
// A load checks the file length, the trailer and the checksum before the
// job reports success; seeding with the key also catches a file copied
// under another block's name. Format "vllm" reads and writes vLLM's raw
// layout (the block's bytes only) and can check only the length. A file
// that does not verify is deleted and counted; a file in the other format
// (raw where a trailer is expected) is refused but left alone, and with
// the block size known (namespace block_bytes) lookups answer Miss for it.
//
// Writes go to "<dest>_<unique>.tmp" (vLLM names its temp files the same
// way) and are renamed over the destination, so a crash leaves at most a
// temp file. A start removes the temp files last modified at least
// stale_tmp_age ago (default 10 minutes); younger ones may be another
// process's writes in progress in a shared directory, so they are left
// alone and looked at once more stale_tmp_age later (removed then unless
// modified since). Fan-out directories are created on demand with one
// mkdir per new directory; recently used ones are remembered.
//
// With O_DIRECT (probed at start with an aligned write; o_direct: auto
// falls back to buffered I/O with one log line) the aligned bulk of a
// file is written directly and its unaligned tail (the trailer) through
// the page cache, after turning O_DIRECT off on the descriptor; where
// that is impossible the tail is padded to the alignment and the file
// truncated back. When the arena slot is aligned and the block size a
// multiple of the alignment the slot is written and read in place (its
// checksum computed on another goroutine while the payload is written);
// otherwise an aligned bounce buffer per worker is used. A slot read into
// before verification is not exposed: the promotion target stays pending
// until the job reports success.
//
// Index and capacity. The tier keeps an in-memory index of its files
// (key, size, LRU links, reader count): 40 bytes per entry plus the key
// bytes (36 for vLLM's 32-byte hashes, a 48-byte allocation) plus the map
// slot (~28 bytes), about 116 bytes per block (TestIndexEntrySize checks
// ≤ 128). With max_bytes set, a store that would push usage over
// high_watermark × max_bytes first evicts least-recently-used files down
// to low_watermark × max_bytes; a file being read is never evicted, and
// every eviction emits a removed event (STORAGE, the tier's locality) when
// events are on. On start the index is rebuilt by walking the directory
// (names and stat sizes only, oldest modification first in LRU order), so
// blocks written before a restart are served after it.
//
// Lookups are asynchronous (package asynclookup): the first lookup of a
// key answers Retry, the step's keys are checked in one batch flushed at
// OnScheduleEnd (index first, a stat for keys the index does not know, so
// files written by another process are found), and a failed load marks
// the key Miss for the requests that asked, so nothing re-promotes in a
// loop.
package fs
