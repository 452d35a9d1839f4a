package remote

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/kvtier/kvtier/offload"
)

func TestEnvelopeRoundTripAndEveryByteFlip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		payload := rapid.SliceOfN(rapid.Byte(), 1, 300).Draw(t, "payload")
		hash := rapid.SliceOfN(rapid.Byte(), 1, 40).Draw(t, "hash")
		key := offload.MakeKey(hash, rapid.Uint32().Draw(t, "group"))
		sealed := Seal(nil, key, payload)
		dst := make([]byte, len(payload))
		if err := OpenString(key, string(sealed), dst); err != nil || !bytes.Equal(dst, payload) {
			t.Fatalf("round trip: %v", err)
		}
		h, err := ParseHeader(sealed[:HeaderSize], key)
		if err != nil || h.Verify(sealed[HeaderSize:]) != nil || h.CheckLen(len(payload)) != nil {
			t.Fatalf("header path: %v", err)
		}
		// Any single flipped bit anywhere is detected, and nothing reaches dst.
		pos := rapid.IntRange(0, len(sealed)-1).Draw(t, "pos")
		bit := byte(1) << rapid.IntRange(0, 7).Draw(t, "bit")
		bad := bytes.Clone(sealed)
		bad[pos] ^= bit
		clear(dst)
		err = OpenString(key, string(bad), dst)
		if err == nil {
			t.Fatalf("flip at %d undetected", pos)
		}
		if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrSizeMismatch) {
			t.Fatalf("flip at %d: %v", pos, err)
		}
		if !bytes.Equal(dst, make([]byte, len(dst))) {
			t.Fatal("bad block copied into dst")
		}
		// Truncation and extension are detected.
		cut := rapid.IntRange(0, len(sealed)-1).Draw(t, "cut")
		if err := OpenString(key, string(sealed[:cut]), dst); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("truncated to %d: %v", cut, err)
		}
		if err := OpenString(key, string(sealed)+"x", dst); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("extended: %v", err)
		}
		// Another key's envelope is rejected.
		other := offload.MakeKey(append(bytes.Clone(hash), 1), key.Group())
		if err := OpenString(other, string(sealed), dst); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("other key: %v", err)
		}
	})
}

func TestEnvelopeSizeMismatch(t *testing.T) {
	key := offload.MakeKey([]byte("h"), 0)
	sealed := Seal(nil, key, make([]byte, 100))
	if err := OpenString(key, string(sealed), make([]byte, 99)); !errors.Is(err, ErrSizeMismatch) {
		t.Fatalf("got %v", err)
	}
}

func TestBodyReadSeek(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		head := rapid.SliceOfN(rapid.Byte(), 0, 40).Draw(t, "head")
		payload := rapid.SliceOfN(rapid.Byte(), 0, 200).Draw(t, "payload")
		want := append(bytes.Clone(head), payload...)
		b := NewBody(head, payload)
		if b.Len() != int64(len(want)) {
			t.Fatalf("Len %d", b.Len())
		}
		off := rapid.IntRange(0, len(want)).Draw(t, "seek")
		if _, err := b.Seek(int64(off), io.SeekStart); err != nil {
			t.Fatal(err)
		}
		chunk := rapid.IntRange(1, 17).Draw(t, "chunk")
		var got []byte
		buf := make([]byte, chunk)
		for {
			n, err := b.Read(buf)
			got = append(got, buf[:n]...)
			if err == io.EOF {
				break
			}
		}
		if !bytes.Equal(got, want[off:]) {
			t.Fatalf("read from %d in %d-byte chunks: got %d bytes", off, chunk, len(got))
		}
	})
	if _, err := NewBody(nil, nil).Seek(-1, io.SeekStart); err == nil {
		t.Fatal("negative seek accepted")
	}
}

func job(id uint64) *offload.Job { return &offload.Job{ID: id} }

func TestJobsExactlyOnce(t *testing.T) {
	j := NewJobTable("t", 2)
	release := make(chan struct{})
	run := func(ctx context.Context, _ *offload.Job) offload.JobResult {
		select {
		case <-release:
			return offload.JobResult{Success: true}
		case <-ctx.Done():
			return offload.JobResult{Err: ctx.Err()}
		}
	}
	if !j.Submit(job(1), run) || !j.Submit(job(2), run) {
		t.Fatal("submit refused")
	}
	if j.Submit(job(3), run) {
		t.Fatal("third job admitted over max_inflight 2")
	}
	if r := j.Take(); len(r) != 1 || r[0].JobID != 3 || !errors.Is(r[0].Err, ErrOverloaded) {
		t.Fatalf("%+v", r)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	if err := j.Drain(ctx); err == nil {
		t.Fatal("drain returned with jobs running")
	}
	cancel()
	close(release)
	if err := j.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	if r := j.Take(); len(r) != 2 || !r[0].Success || !r[1].Success {
		t.Fatalf("%+v", r)
	}
	if j.Pending() {
		t.Fatal("pending after everything was taken")
	}
}

func TestJobsCloseAnswersStuckJobs(t *testing.T) {
	j := NewJobTable("t", 0)
	stuck := make(chan struct{})
	defer close(stuck)
	j.Submit(job(1), func(context.Context, *offload.Job) offload.JobResult {
		<-stuck // ignores cancellation
		return offload.JobResult{Success: true}
	})
	j.Submit(job(2), func(ctx context.Context, _ *offload.Job) offload.JobResult {
		<-ctx.Done()
		return offload.JobResult{Err: ctx.Err()}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	if err := j.Close(ctx); err == nil {
		t.Fatal("Close reported success with a stuck job")
	}
	res := j.Take()
	if len(res) != 2 {
		t.Fatalf("%+v", res)
	}
	for _, r := range res {
		if r.Success {
			t.Fatalf("job %d succeeded", r.JobID)
		}
	}
	j.Submit(job(3), nil)
	if r := j.Take(); len(r) != 1 || !errors.Is(r[0].Err, ErrClosed) {
		t.Fatalf("%+v", r)
	}
	if err := j.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestHealthThresholdAndRecovery(t *testing.T) {
	var up atomic.Bool
	var recovered atomic.Int32
	h := NewHealth("t", func(context.Context) error {
		if up.Load() {
			return nil
		}
		return errors.New("down")
	}, HealthOptions{Threshold: 3, Interval: 5 * time.Millisecond, Logger: slog.New(slog.DiscardHandler),
		OnRecover: func(context.Context) { recovered.Add(1) }})
	defer h.Close()
	h.Failure(errors.New("x"))
	h.Failure(errors.New("x"))
	h.Success() // resets the streak
	h.Failure(errors.New("x"))
	h.Failure(errors.New("x"))
	if !h.Healthy() {
		t.Fatal("down before the threshold")
	}
	h.Failure(errors.New("x"))
	if h.Healthy() || h.Downs() != 1 {
		t.Fatal("not down at the threshold")
	}
	time.Sleep(30 * time.Millisecond)
	if h.Healthy() {
		t.Fatal("up while the probe fails")
	}
	up.Store(true)
	deadline := time.Now().Add(5 * time.Second)
	for !h.Healthy() {
		if time.Now().After(deadline) {
			t.Fatal("never recovered")
		}
		time.Sleep(time.Millisecond)
	}
	if recovered.Load() != 1 {
		t.Fatalf("OnRecover ran %d times", recovered.Load())
	}
	h.Close()
	h.Close()
}

func TestBackoffAndPrefix(t *testing.T) {
	for n := 1; n < 10; n++ {
		d := Backoff(10*time.Millisecond, n, uint64(n))
		lo := 10 * time.Millisecond << min(n-1, 5)
		if d < lo || d > lo+lo/2 {
			t.Fatalf("attempt %d: %v not in [%v, %v]", n, d, lo, lo+lo/2)
		}
	}
	keys := []offload.Key{"a0000", "b0000", "c0000"}
	e := errors.New("x")
	if p, err := loadedKeys(keys, []error{nil, e, nil}); len(p) != 2 || p[0] != keys[0] || p[1] != keys[2] || err != e {
		t.Fatal(p, err)
	}
	if p, err := loadedKeys(keys, []error{e, e, e}); p != nil || err != e {
		t.Fatal(p, err)
	}
	if p, err := loadedKeys(keys, make([]error, 3)); len(p) != 3 || err != nil {
		t.Fatal(p, err)
	}
}

// TestForEachPanic: a call that panics fails alone, on the job's
// goroutine (n == 1) or on its own, and gives its semaphore slot back.
func TestForEachPanic(t *testing.T) {
	sem := make(chan struct{}, 2)
	for _, n := range []int{1, 3} {
		for round := 0; round < 3; round++ { // more panics than sem slots
			errs := ForEach(context.Background(), sem, n, func(_ context.Context, i int) error {
				if i == n-1 {
					panic("boom")
				}
				return nil
			})
			for i, err := range errs {
				if (i == n-1) != (err != nil) {
					t.Fatalf("n=%d: errs %v", n, errs)
				}
			}
			if len(sem) != 0 {
				t.Fatalf("n=%d: %d sem slots still taken", n, len(sem))
			}
		}
	}
}

func TestJobsPanicIsAFailedResult(t *testing.T) {
	j := NewJobTable("t", 0)
	j.Submit(job(1), func(context.Context, *offload.Job) offload.JobResult { panic("boom") })
	if err := j.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	r := j.Take()
	if len(r) != 1 || r[0].JobID != 1 || r[0].Success || r[0].Err == nil {
		t.Fatalf("%+v", r)
	}
	j.Close(context.Background())
}
