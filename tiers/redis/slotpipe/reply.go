package slotpipe

import (
	"errors"
	"fmt"
	"strconv"
)

// MaxReplyLine bounds one reply line: SET answers OK or an error message
// (MOVED carries a slot and an address), GET a length, never more.
const MaxReplyLine = 4096

// ErrProtocol reports a reply that is not the command's; the connection
// is closed.
var ErrProtocol = errors.New("redis protocol error")

// Error is a server's error reply to one command. It has go-redis'
// RedisError marker, so code that classifies go-redis' errors classifies
// these alike.
type Error string

func (e Error) Error() string { return string(e) }

// RedisError marks Error as a Redis server error reply.
func (Error) RedisError() {}

// parseStatus reads one reply line to SET (terminator included): nil for
// +OK, an Error for an error line, ErrProtocol for anything else.
func parseStatus(line []byte) (verdict, err error) {
	body, ok := cutCRLF(line)
	if ok && len(body) > 1 {
		switch {
		case body[0] == '+' && string(body[1:]) == "OK":
			return nil, nil
		case body[0] == '-':
			return Error(body[1:]), nil
		}
	}
	return nil, fmt.Errorf("%w: reply %q to SET", ErrProtocol, line)
}

// parseBulkHeader reads the first line of a reply to GET: the length of
// the bulk string that follows (-1: nil, no such key), or the server's
// error, or ErrProtocol.
func parseBulkHeader(line []byte) (n int, verdict, err error) {
	body, ok := cutCRLF(line)
	if ok && len(body) > 1 {
		switch body[0] {
		case '-':
			return 0, Error(body[1:]), nil
		case '$':
			if s := body[1:]; string(s) == "-1" {
				return -1, nil, nil
			} else if canonical(s) {
				if n, perr := strconv.Atoi(string(s)); perr == nil {
					return n, nil, nil
				}
			}
		}
	}
	return 0, nil, fmt.Errorf("%w: reply %q to GET", ErrProtocol, line)
}

// canonical reports whether s is a decimal number without sign or
// leading zeros.
func canonical(s []byte) bool {
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return len(s) > 0 && (s[0] != '0' || len(s) == 1)
}

func cutCRLF(line []byte) ([]byte, bool) {
	n := len(line)
	if n < 2 || line[n-2] != '\r' || line[n-1] != '\n' {
		return nil, false
	}
	return line[:n-2], true
}

// appendCommand appends args as a RESP array of bulk strings.
func appendCommand(b []byte, args ...string) []byte {
	b = append(b, '*')
	b = strconv.AppendInt(b, int64(len(args)), 10)
	b = append(b, "\r\n"...)
	for _, a := range args {
		b = appendBulk(b, a)
	}
	return b
}

func appendBulk(b []byte, v string) []byte {
	b = append(b, '$')
	b = strconv.AppendInt(b, int64(len(v)), 10)
	b = append(b, "\r\n"...)
	b = append(b, v...)
	return append(b, "\r\n"...)
}
