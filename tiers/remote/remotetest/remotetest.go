// Package remotetest holds helpers for testing secondary tiers: an
// in-memory arena and loops that drive a tier's asynchronous calls to an
// answer.
package remotetest

import (
	"context"
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	"github.com/kvtier/kvtier/offload"
)

// Arena is a heap-backed offload.Arena.
type Arena struct {
	slotSize int
	mem      []byte
}

// NewArena returns an arena of n slots of slotSize bytes.
func NewArena(slotSize, n int) *Arena {
	return &Arena{slotSize: slotSize, mem: make([]byte, slotSize*n)}
}

// SlotSize implements offload.Arena.
func (a *Arena) SlotSize() int { return a.slotSize }

// NumSlots implements offload.Arena.
func (a *Arena) NumSlots() int { return len(a.mem) / a.slotSize }

// Slot implements offload.Arena.
func (a *Arena) Slot(i int64) ([]byte, error) {
	if i < 0 || i >= int64(a.NumSlots()) {
		return nil, fmt.Errorf("slot %d of %d: %w", i, a.NumSlots(), offload.ErrSlotOutOfRange)
	}
	off := int(i) * a.slotSize
	return a.mem[off : off+a.slotSize : off+a.slotSize], nil
}

// Fill writes a pattern derived from seed into slot i.
func (a *Arena) Fill(i int64, seed uint64) {
	s, _ := a.Slot(i)
	x := seed*0x9e3779b97f4a7c15 + 1
	for off := 0; off+8 <= len(s); off += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(s[off:], x)
	}
	for off := len(s) &^ 7; off < len(s); off++ {
		s[off] = byte(seed)
	}
}

// Key returns a test key: a 16-byte hash derived from i, group 0.
func Key(i int) offload.Key {
	var h [16]byte
	binary.BigEndian.PutUint64(h[0:], 0xc0ffee)
	binary.BigEndian.PutUint64(h[8:], uint64(i))
	return offload.MakeKey(h[:], 0)
}

// Keys returns Key(from) … Key(from+n-1).
func Keys(from, n int) []offload.Key {
	out := make([]offload.Key, n)
	for i := range out {
		out[i] = Key(from + i)
	}
	return out
}

// Slots returns the slot indexes from … from+n-1.
func Slots(from, n int) []int64 {
	out := make([]int64, n)
	for i := range out {
		out[i] = int64(from + i)
	}
	return out
}

// WaitJobs polls tier.FinishedJobs until n results arrived or timeout
// passes, failing the test on timeout or on a duplicate job id.
func WaitJobs(t testing.TB, tier offload.SecondaryTier, n int, timeout time.Duration) []offload.JobResult {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var out []offload.JobResult
	seen := map[uint64]bool{}
	for len(out) < n {
		for _, r := range tier.FinishedJobs() {
			if seen[r.JobID] {
				t.Fatalf("job %d answered twice", r.JobID)
			}
			seen[r.JobID] = true
			out = append(out, r)
		}
		if len(out) >= n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("got %d of %d job results after %v", len(out), n, timeout)
		}
		// DrainJobs returns the moment the last job finishes, so waiting
		// adds no polling latency (benchmarks use this too).
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
		if tier.DrainJobs(ctx) == nil && !tier.HasPendingWork() {
			time.Sleep(time.Millisecond)
		}
		cancel()
	}
	return out
}

// Run submits job (a load when job.Promotion) and waits for its result.
func Run(t testing.TB, tier offload.SecondaryTier, job *offload.Job) offload.JobResult {
	t.Helper()
	if job.Promotion {
		tier.SubmitLoad(job)
	} else {
		tier.SubmitStore(job)
	}
	res := WaitJobs(t, tier, 1, 30*time.Second)[0]
	if res.JobID != job.ID {
		t.Fatalf("result for job %d, want %d", res.JobID, job.ID)
	}
	return res
}

// Resolve looks key up until the answer is not Retry, ending a step
// (OnScheduleEnd) between attempts as the manager would.
func Resolve(t testing.TB, tier offload.SecondaryTier, key offload.Key, req *offload.ReqContext) offload.LookupResult {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		r := tier.Lookup(key, req)
		if r != offload.Retry {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("lookup of %s still Retry after 30s", key)
		}
		tier.OnScheduleEnd(offload.ScheduleEnd{})
		time.Sleep(2 * time.Millisecond)
	}
}

// Eventually polls cond every 10ms until it holds or timeout passes.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Drain calls DrainJobs with a timeout, failing the test on error.
func Drain(t testing.TB, tier offload.SecondaryTier) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := tier.DrainJobs(ctx); err != nil {
		t.Fatalf("DrainJobs: %v", err)
	}
}
