package workload

import (
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestReaderParses(t *testing.T) {
	in := `{"timestamp": 0, "input_length": 1100, "output_length": 7, "hash_ids": [0, 1, 2]}

{"timestamp": 25, "input_length": 600, "output_length": 0, "hash_ids": [0, 18446744073709551615], "extra": {"x": [1]}}` + "\r\n" +
		`{"hash_ids": []}` + "\n   \n" +
		`{"hash_ids": [5], "timestamp": -3}`
	got, err := ReadAll(strings.NewReader(in), ReaderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := []Request{
		{Line: 1, Timestamp: 0, InputLength: 1100, OutputLength: 7, HashIDs: []uint64{0, 1, 2}},
		{Line: 3, Timestamp: 25, InputLength: 600, HashIDs: []uint64{0, 1<<64 - 1}},
		{Line: 4, HashIDs: []uint64{}},
		{Line: 6, Timestamp: -3, HashIDs: []uint64{5}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("requests (-want +got):\n%s", diff)
	}
}

func TestReaderLimit(t *testing.T) {
	in := strings.Repeat(`{"hash_ids": [1]}`+"\n", 5) + "not json\n"
	got, err := ReadAll(strings.NewReader(in), ReaderOptions{Limit: 3})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 {
		t.Errorf("read %d requests, want 3", len(got))
	}
}

func TestReaderErrors(t *testing.T) {
	valid := `{"hash_ids": [1, 2]}` + "\n"
	tests := []struct {
		name   string
		in     string
		opts   ReaderOptions
		line   int
		is     error
		substr string
	}{
		{"not json", valid + "hello\n", ReaderOptions{}, 2, ErrSyntax, "invalid character"},
		{"array", `[1, 2]`, ReaderOptions{}, 1, ErrSyntax, "want a JSON object, got array"},
		{"trailing data", `{"hash_ids": [1]} {}`, ReaderOptions{}, 1, ErrSyntax, "after top-level value"},
		{"truncated", valid + `{"hash_ids": [1, 2`, ReaderOptions{}, 2, ErrSyntax, "unexpected end"},
		{"missing hash_ids", `{"timestamp": 1}`, ReaderOptions{}, 1, ErrSyntax, "hash_ids missing or null"},
		{"null hash_ids", `{"hash_ids": null}`, ReaderOptions{}, 1, ErrSyntax, "hash_ids missing or null"},
		{"hash_ids not a list", `{"hash_ids": 3}`, ReaderOptions{}, 1, ErrSyntax, "hash_ids: unexpected JSON number"},
		{"negative id", valid + valid + `{"hash_ids": [1, -2]}`, ReaderOptions{}, 3, ErrSyntax, "hash_ids[1] = -2"},
		{"fractional id", `{"hash_ids": [1.5]}`, ReaderOptions{}, 1, ErrSyntax, "hash_ids[0] = 1.5"},
		{"id too large", `{"hash_ids": [18446744073709551616]}`, ReaderOptions{}, 1, ErrSyntax, "hash_ids[0]"},
		{"string id", `{"hash_ids": ["x"]}`, ReaderOptions{}, 1, ErrSyntax, "invalid number literal"},
		{"negative length", `{"hash_ids": [], "input_length": -1}`, ReaderOptions{}, 1, ErrSyntax, "input_length = -1"},
		{"fractional timestamp", `{"hash_ids": [], "timestamp": 1.25}`, ReaderOptions{}, 1, ErrSyntax, "timestamp = 1.25"},
		{"too many ids", `{"hash_ids": [1, 2, 3]}`, ReaderOptions{MaxHashIDs: 2}, 1, ErrTooManyHashIDs, "3 (at most 2)"},
		{"line too long", valid + `{"hash_ids": [1, 2, 3, 4, 5, 6]}` + "\n" + valid, ReaderOptions{MaxLineBytes: 24}, 2, ErrLineTooLong, "more than 24 bytes"},
		{"last line too long", valid + strings.Repeat(" ", 100), ReaderOptions{MaxLineBytes: 24}, 2, ErrLineTooLong, "more than 24 bytes"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := NewReader(strings.NewReader(tc.in), tc.opts)
			var err error
			for err == nil {
				_, err = r.Next()
			}
			var pe *ParseError
			if !errors.As(err, &pe) {
				t.Fatalf("error %v (%T), want a *ParseError", err, err)
			}
			if pe.Line != tc.line {
				t.Errorf("line %d, want %d (%v)", pe.Line, tc.line, err)
			}
			if !errors.Is(err, tc.is) {
				t.Errorf("error %v does not wrap %v", err, tc.is)
			}
			if !strings.Contains(err.Error(), tc.substr) {
				t.Errorf("error %q does not mention %q", err, tc.substr)
			}
			if _, again := r.Next(); again != err {
				t.Errorf("Next after the error returned %v, want the same error", again)
			}
		})
	}
}

func TestReaderReadError(t *testing.T) {
	boom := errors.New("disk on fire")
	r := NewReader(io.MultiReader(strings.NewReader(`{"hash_ids": [1]}`+"\n"), errReader{boom}), ReaderOptions{})
	if _, err := r.Next(); err != nil {
		t.Fatal(err)
	}
	_, err := r.Next()
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "after line 1") {
		t.Errorf("error %v, want the read error after line 1", err)
	}
}

type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }

func TestRequestsSource(t *testing.T) {
	reqs := []Request{{Line: 1}, {Line: 2}}
	src := Requests(reqs)
	for i := range reqs {
		r, err := src.Next()
		if err != nil || r.Line != i+1 {
			t.Fatalf("Next = %v, %v", r, err)
		}
	}
	if _, err := src.Next(); err != io.EOF {
		t.Errorf("after the last request: %v, want io.EOF", err)
	}
}
