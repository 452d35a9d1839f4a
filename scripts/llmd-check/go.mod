// A separate module: llm-d-kv-cache is not on the Go module proxy, so
// run.sh copies this directory beside a checkout of it and points the
// module at that checkout and at this repository.
module github.com/kvtier/kvtier/scripts/llmd-check

go 1.26
