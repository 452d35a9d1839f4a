// Package ratelog bounds how often a repeated log line is written: a
// listener that refuses a flood of connections logs one line per interval
// with the number of refusals it did not log, not one line per refusal.
//
// A Limiter keys lines by a caller-chosen string (the event: "refused
// connection on the events socket"). The first line of a key is written;
// later ones within Interval are counted; the first one after Interval is
// written with "suppressed", the count since the last line written. A key
// quiet for Interval starts afresh. The zero Limiter is ready, with an
// interval of DefaultInterval; it is safe for concurrent use.
package ratelog
