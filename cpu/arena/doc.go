// Package arena provides slot arenas: one contiguous memory region divided
// into fixed-size slots, the memory that KV blocks are copied into and out
// of.
//
// The backing memory is either anonymous (private to this process) or
// shareable with another process — a file (typically under /dev/shm) or a
// memfd — so that an inference engine can map the same slots and transfer
// blocks without copying them through a socket. Shared backings are
// reserved with fallocate at creation, so that running out of memory is an
// error from New rather than a SIGBUS on first touch.
//
// An Arena hands out views of its slots; it does not track who uses them.
// Callers must stop using every view before Close (kvtier's pin protocol
// guarantees that for the primary tier).
package arena
