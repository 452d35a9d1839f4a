// Package budget bounds bytes held at once by many holders: a total for
// the whole process, and a share no single holder may exceed, so that one
// holder (a tenant, a peer) that keeps its grants for long cannot take
// what the others need.
//
// The daemon uses it for request bytes in flight: before gRPC reads a
// call's request, the call acquires the largest message it may carry and
// gives it back once the request is decoded. A call that does not fit
// waits, in arrival order among the calls that could fit, until its
// context ends.
//
// # Invariants
//
//   - At every instant the bytes granted are at most the total, and the
//     bytes granted to one holder at most the share.
//   - A grant is given back by its one Release; the zero Grant (what a
//     failed Acquire returns) gives back nothing.
//   - A waiter whose context ends holds nothing afterwards, even when a
//     grant raced with its cancellation.
//
// # Concurrency
//
// One mutex guards the counters and the queue of waiters. Acquire takes it
// once on the fast path (room is free and nobody waits); a release grants
// waiters in order while they fit, skipping those whose holder is at its
// share, so a holder at its share never blocks another.
package budget
