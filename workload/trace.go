package workload

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
)

// BlockTokens is the number of tokens one Mooncake hash id stands for.
const BlockTokens = 512

// Bounds applied when ReaderOptions leaves them zero.
const (
	// DefaultMaxLineBytes bounds one trace line (the Mooncake conversation
	// trace's longest line is about 2 KiB).
	DefaultMaxLineBytes = 1 << 20
	// DefaultMaxHashIDs bounds the blocks of one request: 65 536 blocks of
	// 512 tokens is a 32 Mi-token prompt, far beyond any model's context.
	DefaultMaxHashIDs = 1 << 16
)

// Errors a ParseError wraps, for callers that test the condition.
var (
	// ErrLineTooLong reports a line longer than ReaderOptions.MaxLineBytes.
	ErrLineTooLong = errors.New("line too long")
	// ErrTooManyHashIDs reports a request with more hash ids than
	// ReaderOptions.MaxHashIDs.
	ErrTooManyHashIDs = errors.New("too many hash_ids")
	// ErrSyntax reports a line that is not a well-formed trace record.
	ErrSyntax = errors.New("malformed trace record")
)

// ParseError is an error at one line of a trace.
type ParseError struct {
	Line int // 1-based
	Err  error
}

func (e *ParseError) Error() string { return fmt.Sprintf("trace line %d: %v", e.Line, e.Err) }

func (e *ParseError) Unwrap() error { return e.Err }

// Request is one request of a trace.
type Request struct {
	// Line is the request's 1-based line number in the trace.
	Line int
	// Timestamp is the arrival time in milliseconds, relative to the
	// trace's start.
	Timestamp int64
	// InputLength and OutputLength are the prompt and completion lengths
	// in tokens.
	InputLength, OutputLength int64
	// HashIDs are the prompt's block ids in order, one per BlockTokens
	// tokens; a request shares its cached prefix with another exactly as
	// far as their leading ids are equal.
	HashIDs []uint64
}

// ReaderOptions bounds what a Reader accepts; zero values mean the
// defaults.
type ReaderOptions struct {
	MaxLineBytes int // default DefaultMaxLineBytes
	MaxHashIDs   int // default DefaultMaxHashIDs
	// Limit stops the reader after this many requests (0 = no limit).
	Limit int
}

// Reader reads trace requests one line at a time. Blank lines are
// skipped; fields other than the four of the format are ignored, so that
// traces carrying extra fields still parse.
type Reader struct {
	sc    *bufio.Scanner
	opts  ReaderOptions
	line  int
	count int
	err   error
}

// NewReader returns a Reader of the trace in r.
func NewReader(r io.Reader, opts ReaderOptions) *Reader {
	if opts.MaxLineBytes <= 0 {
		opts.MaxLineBytes = DefaultMaxLineBytes
	}
	if opts.MaxHashIDs <= 0 {
		opts.MaxHashIDs = DefaultMaxHashIDs
	}
	sc := bufio.NewScanner(r)
	// +1 leaves room for a '\r' before the newline, which is not content.
	sc.Buffer(make([]byte, 0, min(opts.MaxLineBytes+1, 64<<10)), opts.MaxLineBytes+1)
	return &Reader{sc: sc, opts: opts}
}

// Next returns the next request, or io.EOF after the last one (or after
// ReaderOptions.Limit requests). A malformed line ends the trace with a
// *ParseError naming the line; Next then keeps returning that error.
func (r *Reader) Next() (Request, error) {
	if r.err != nil {
		return Request{}, r.err
	}
	if r.opts.Limit > 0 && r.count >= r.opts.Limit {
		r.err = io.EOF
		return Request{}, r.err
	}
	for r.sc.Scan() {
		r.line++
		b := bytes.TrimSuffix(r.sc.Bytes(), []byte{'\r'})
		if len(b) > r.opts.MaxLineBytes {
			r.err = &ParseError{Line: r.line, Err: fmt.Errorf("%w: more than %d bytes", ErrLineTooLong, r.opts.MaxLineBytes)}
			return Request{}, r.err
		}
		if len(bytes.TrimSpace(b)) == 0 {
			continue
		}
		req, err := r.parse(b)
		if err != nil {
			r.err = &ParseError{Line: r.line, Err: err}
			return Request{}, r.err
		}
		r.count++
		return req, nil
	}
	switch err := r.sc.Err(); {
	case errors.Is(err, bufio.ErrTooLong):
		r.err = &ParseError{Line: r.line + 1, Err: fmt.Errorf("%w: more than %d bytes", ErrLineTooLong, r.opts.MaxLineBytes)}
	case err != nil:
		r.err = fmt.Errorf("trace: read after line %d: %w", r.line, err)
	default:
		r.err = io.EOF
	}
	return Request{}, r.err
}

// record is the JSON shape of a line. Numbers stay json.Number so that
// each field's error can say what was wrong in the trace's own terms.
type record struct {
	Timestamp    *json.Number   `json:"timestamp"`
	InputLength  *json.Number   `json:"input_length"`
	OutputLength *json.Number   `json:"output_length"`
	HashIDs      *[]json.Number `json:"hash_ids"`
}

// fastRecord decodes a well-formed line directly; a line it rejects is
// decoded again as a record to say precisely what is wrong.
type fastRecord struct {
	Timestamp    int64     `json:"timestamp"`
	InputLength  int64     `json:"input_length"`
	OutputLength int64     `json:"output_length"`
	HashIDs      *[]uint64 `json:"hash_ids"`
}

func (r *Reader) parse(line []byte) (Request, error) {
	var fast fastRecord
	if json.Unmarshal(line, &fast) == nil && fast.HashIDs != nil && len(*fast.HashIDs) <= r.opts.MaxHashIDs &&
		fast.InputLength >= 0 && fast.OutputLength >= 0 {
		return Request{
			Line: r.line, Timestamp: fast.Timestamp,
			InputLength: fast.InputLength, OutputLength: fast.OutputLength,
			HashIDs: *fast.HashIDs,
		}, nil
	}
	var rec record
	if err := json.Unmarshal(line, &rec); err != nil {
		return Request{}, fmt.Errorf("%w: %v", ErrSyntax, jsonError(err))
	}
	if rec.HashIDs == nil { // absent or null; [] is a request without blocks
		return Request{}, fmt.Errorf("%w: hash_ids missing or null", ErrSyntax)
	}
	raw := *rec.HashIDs
	if len(raw) > r.opts.MaxHashIDs {
		return Request{}, fmt.Errorf("%w: %d (at most %d)", ErrTooManyHashIDs, len(raw), r.opts.MaxHashIDs)
	}
	req := Request{Line: r.line, HashIDs: make([]uint64, len(raw))}
	for i, n := range raw {
		v, err := strconv.ParseUint(string(n), 10, 64)
		if err != nil {
			return Request{}, fmt.Errorf("%w: hash_ids[%d] = %s: want an integer in [0, 2^64)", ErrSyntax, i, n)
		}
		req.HashIDs[i] = v
	}
	var err error
	if req.Timestamp, err = integer("timestamp", rec.Timestamp, true); err != nil {
		return Request{}, err
	}
	if req.InputLength, err = integer("input_length", rec.InputLength, false); err != nil {
		return Request{}, err
	}
	if req.OutputLength, err = integer("output_length", rec.OutputLength, false); err != nil {
		return Request{}, err
	}
	return req, nil
}

// integer parses an optional integer field; absent or null is 0.
func integer(name string, n *json.Number, signed bool) (int64, error) {
	if n == nil || *n == "" {
		return 0, nil
	}
	v, err := strconv.ParseInt(string(*n), 10, 64)
	if err != nil || (!signed && v < 0) {
		want := "a non-negative integer"
		if signed {
			want = "an integer"
		}
		return 0, fmt.Errorf("%w: %s = %s: want %s", ErrSyntax, name, *n, want)
	}
	return v, nil
}

// jsonError trims encoding/json's Go-centric wording.
func jsonError(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		if te.Field == "" {
			return fmt.Sprintf("want a JSON object, got %s", te.Value)
		}
		return fmt.Sprintf("%s: unexpected JSON %s", te.Field, te.Value)
	}
	return err.Error()
}

// ReadAll reads every request of the trace in r (up to opts.Limit).
func ReadAll(r io.Reader, opts ReaderOptions) ([]Request, error) {
	tr := NewReader(r, opts)
	var out []Request
	for {
		req, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		out = append(out, req)
	}
}

// Source yields requests in order, io.EOF after the last. *Reader is a
// Source.
type Source interface {
	Next() (Request, error)
}

// Requests returns a Source over reqs.
func Requests(reqs []Request) Source { return &sliceSource{reqs: reqs} }

type sliceSource struct {
	reqs []Request
	i    int
}

func (s *sliceSource) Next() (Request, error) {
	if s.i >= len(s.reqs) {
		return Request{}, io.EOF
	}
	s.i++
	return s.reqs[s.i-1], nil
}
