// Package slotpipe moves Redis values straight between the socket and the
// caller's memory: pipelines of SET whose values come in pieces (kvtier's
// envelope header and the block in its slot), and pipelines of GET whose
// values are read into pieces (a header buffer and the slot).
//
// # Why
//
// A Redis client library sends a value from one contiguous buffer and
// reads one into a buffer it allocates, so a store of a 2 MiB block
// behind a 32-byte header costs a 2 MiB copy before the socket sees a
// byte, and a load costs a 2 MiB allocation, its zeroing and a copy into
// the slot. On a machine whose cores the servers share those copies took
// a fifth of the throughput. Here each SET is one vectored write (writev)
// of the command's prefix, the value's pieces and its suffix as far as the
// socket takes them, and each GET's value is read by the kernel into the
// pieces themselves.
//
// # Mechanism
//
// Pools holds, per server address, a bounded set of idle connections of
// its own (RESP2; TLS, AUTH and SELECT on dial when configured; an idle
// plain-TCP connection the server has closed is dropped, not handed out —
// a TLS one shows as a failed call). Over TLS, which has no non-blocking
// write, Set copies the whole value and writes it in the background. On
// a Conn:
//
//   - Set writes one SET without waiting on the server: what the socket
//     takes at once goes straight from the pieces in one non-blocking
//     vectored write, the rest is copied into a pooled buffer and
//     written in the background. Either way the pieces are not read once
//     Set returns, so the time a caller lends them is bounded by memory
//     speed, not by the server's (kvtier's tiers claim a block's slot only
//     for that long, so eviction can take it back whatever the network
//     does). Ready waits for the background write of the previous Set, so
//     that the next Set does not wait while a buffer is lent. Replies then
//     reads one verdict per SET: nil for OK, an Error for a server error
//     reply.
//   - Get queues one GET; the first ReadValue writes every queued command
//     at once, and each ReadValue reads the next reply: missing, the server's
//     error, or the value — into the caller's pieces when its length is
//     theirs, else into a buffer of its own up to a bound, else discarded.
//
// MOVED and ASK are error replies like any other: this package follows no
// redirections; the caller sends those commands again through a full
// client.
//
// # Invariants
//
//   - A connection goes back to its pool only with no reply outstanding
//     and no error seen on it; any transport or protocol error closes it,
//     so a reply is never matched to the wrong command.
//   - A reply this package does not expect (for SET anything but OK or an
//     error line; for GET anything but a bulk string, nil or an error
//     line; a line longer than MaxReplyLine) is a protocol error, never a
//     success.
//   - Bytes read into the caller's pieces are what the server sent for
//     that command, unverified: checking them (kvtier's envelope) is the
//     caller's job, and on a protocol or transport error the pieces may
//     hold part of a value.
//   - Every call is bounded: the context's deadline and the per-operation
//     timeout apply to dialing, to each write and to each read, and a
//     context canceled mid-call interrupts it.
//
// # Concurrency
//
// Pools is safe for concurrent use. A Conn belongs to one goroutine from
// Get until Put or Close.
package slotpipe
