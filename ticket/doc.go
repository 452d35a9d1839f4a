// Package ticket issues short-lived, single-use tickets.
//
// A ticket is 128 random bits, written as 32 hex digits, that an
// authenticated call hands its caller so that a second channel without
// authentication of its own — kvtier's arena side channel, which passes a
// file descriptor over a Unix socket — can tell that the caller was
// allowed. A ticket names one subject (the namespace whose arena it opens)
// and is good once, for a bounded time: redeeming it, successfully or
// not, spends it.
//
// A Book holds at most a fixed number of tickets; issuing past that
// forgets the oldest, so a caller that asks for tickets and never uses
// them costs a bounded amount of memory. Book is safe for concurrent use.
package ticket
