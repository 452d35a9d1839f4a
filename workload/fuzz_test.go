package workload

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/kvtier/kvtier/config"
)

// FuzzReader checks that no input makes the reader panic or break its
// bounds, that errors are line-numbered, and that what it accepts
// round-trips through the format.
func FuzzReader(f *testing.F) {
	for _, s := range []string{
		`{"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1, 2, 3]}`,
		"{\"hash_ids\": []}\n\n{\"hash_ids\": [18446744073709551615]}\r\n",
		`{"hash_ids": [1, -2]}`,
		`{"hash_ids": null}`,
		`{"hash_ids": ["7"], "timestamp": "1"}`,
		`[{"hash_ids": [1]}]`,
		`{"hash_ids": [1e3]}`,
		"{\"hash_ids\": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]}\n" + strings.Repeat("x", 300),
	} {
		f.Add(s)
	}
	const maxLine, maxIDs = 256, 8
	f.Fuzz(func(t *testing.T, in string) {
		r := NewReader(strings.NewReader(in), ReaderOptions{MaxLineBytes: maxLine, MaxHashIDs: maxIDs})
		prevLine := 0
		for {
			req, err := r.Next()
			if errors.Is(err, io.EOF) {
				return
			}
			if err != nil {
				var pe *ParseError
				if !errors.As(err, &pe) {
					t.Fatalf("error %v is not a *ParseError", err)
				}
				if pe.Line <= prevLine {
					t.Fatalf("error at line %d after a request at line %d", pe.Line, prevLine)
				}
				return
			}
			if req.Line <= prevLine {
				t.Fatalf("request at line %d after line %d", req.Line, prevLine)
			}
			prevLine = req.Line
			if len(req.HashIDs) > maxIDs {
				t.Fatalf("%d hash ids accepted, bound %d", len(req.HashIDs), maxIDs)
			}
			if req.InputLength < 0 || req.OutputLength < 0 {
				t.Fatalf("negative length accepted: %+v", req)
			}
			// What was accepted re-encodes to a line that parses the same.
			b, err := json.Marshal(map[string]any{
				"timestamp": req.Timestamp, "input_length": req.InputLength,
				"output_length": req.OutputLength, "hash_ids": req.HashIDs,
			})
			if err != nil {
				t.Fatal(err)
			}
			again, err := ReadAll(strings.NewReader(string(b)), ReaderOptions{MaxLineBytes: 1 << 20})
			if err != nil || len(again) != 1 {
				t.Fatalf("re-encoded %s: %v", b, err)
			}
			got := again[0]
			if got.Timestamp != req.Timestamp || got.InputLength != req.InputLength ||
				got.OutputLength != req.OutputLength || len(got.HashIDs) != len(req.HashIDs) {
				t.Fatalf("round trip changed %+v into %+v", req, got)
			}
			for i := range got.HashIDs {
				if got.HashIDs[i] != req.HashIDs[i] {
					t.Fatalf("round trip changed %+v into %+v", req, got)
				}
			}
		}
	})
}

// FuzzReplay replays whatever traces the reader accepts through a tiny
// primary and a secondary tier: requests larger than the primary,
// repeated ids and huge ids must be served or counted, never fail the
// replay.
func FuzzReplay(f *testing.F) {
	f.Add("{\"hash_ids\": [1, 2, 3]}\n{\"hash_ids\": [1, 2, 3, 4]}\n{\"hash_ids\": [1, 2]}")
	f.Add("{\"hash_ids\": [7, 7, 7, 7]}\n{\"hash_ids\": [7, 8, 7]}")
	f.Add("{\"hash_ids\": [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]}\n{\"hash_ids\": [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]}")
	f.Add("{\"hash_ids\": [18446744073709551615, 0]}\n{\"hash_ids\": []}\n{\"hash_ids\": [18446744073709551615]}")
	cfg, err := config.Parse([]byte("secondary_tiers:\n  - {name: m, type: memory, capacity_blocks: 16}\n"))
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, in string) {
		reqs, err := ReadAll(strings.NewReader(in), ReaderOptions{MaxLineBytes: 512, MaxHashIDs: 32, Limit: 32})
		if err != nil {
			return
		}
		res, err := Replay(context.Background(), Requests(reqs), Options{
			PrimaryBlocks: 8, BlockBytes: 16, Config: cfg, MaxSettleSteps: 8,
		})
		if err != nil {
			t.Fatalf("replay of %d requests: %v", len(reqs), err)
		}
		var blocks uint64
		for _, r := range reqs {
			blocks += uint64(len(r.HashIDs))
		}
		if res.Requests != len(reqs) || res.Blocks != blocks || res.HitBlocks > blocks ||
			res.PrimaryHitBlocks+res.PromotedHitBlocks != res.HitBlocks {
			t.Fatalf("inconsistent result %+v for %d requests, %d blocks", res, len(reqs), blocks)
		}
	})
}
