// Package filemapper is vLLM's FileMapper: which directory a run's KV
// blocks live in, and where each block lives in it (docs/semantics.md §5.1). The
// directory's name is the model name and the first 12 hex digits of the
// sha256 of the namespace's fields rendered as Python's json.dumps renders
// them, so that kvtier's fs tier and vLLM's own share a directory exactly
// when every field matches; the block of a key is a file named by the hex
// of its hash below a per-rank directory. The fs tier keeps its files in
// this layout and the s3 tier names its objects after it, so that a bucket
// prefix holds the tree an fs root would.
package filemapper
