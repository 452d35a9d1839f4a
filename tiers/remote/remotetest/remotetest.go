// Package remotetest holds helpers for testing secondary tiers: an
// in-memory arena, jobs, loops that drive a tier's asynchronous calls to
// an answer, and the plumbing of integration tests against real servers.
package remotetest

import (
	"context"
	"encoding/binary"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvtier/kvtier/config"
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

// StoreJob returns store job id of keys from slots of arena.
func StoreJob(id uint64, arena offload.Arena, keys []offload.Key, slots []int64) *offload.Job {
	return &offload.Job{ID: id, Keys: keys, Slots: slots, Arena: arena, Req: offload.Background("r")}
}

// LoadJob returns load job id of keys into slots of arena for req.
func LoadJob(id uint64, arena offload.Arena, keys []offload.Key, slots []int64, req *offload.ReqContext) *offload.Job {
	return &offload.Job{ID: id, Keys: keys, Slots: slots, Arena: arena, Promotion: true, Req: req}
}

// NewTier builds a tier with newTier(ctx, cfg), failing the test on
// error, and closes it when the test ends.
func NewTier[C any, T offload.SecondaryTier](t testing.TB, newTier func(context.Context, C) (T, error), cfg C) T {
	t.Helper()
	tier, err := newTier(context.Background(), cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		tier.Close(ctx)
	})
	return tier
}

// DecodeTier decodes the first secondary_tiers entry of the config
// document doc into dst the way the daemon does: config.Parse, then
// TierSpec.Decode.
func DecodeTier(doc string, dst any) error {
	cfg, err := config.Parse([]byte(doc))
	if err != nil {
		return err
	}
	if len(cfg.SecondaryTiers) == 0 {
		return fmt.Errorf("no secondary_tiers entry in the document")
	}
	return cfg.SecondaryTiers[0].Decode(dst)
}

// ConfigCase changes a valid tier config; Key is the config key the
// error of the changed config must name, or "" when it must be valid.
type ConfigCase[C any] struct {
	Name string
	Mod  func(*C)
	Key  string
}

// CheckConfig runs validate over base changed by each case and checks
// that it accepts the valid ones and names the key of the others.
func CheckConfig[C any](t *testing.T, base C, validate func(C) error, cases []ConfigCase[C]) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.Name, func(t *testing.T) {
			c := base
			tc.Mod(&c)
			err := validate(c)
			if tc.Key == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.Key+":") {
				t.Fatalf("error %v does not name key %q", err, tc.Key)
			}
		})
	}
}

// HealthyTier is a tier that reports its server's health.
type HealthyTier interface {
	offload.SecondaryTier
	Healthy() bool
}

// StoreUntilDown stores one fresh block after another from slot of arena
// (job ids and keys from id on), as cascades would while the tier's
// server is gone, until the tier marks itself unhealthy. A store that
// succeeds, or a tier still healthy after timeout, fails the test.
func StoreUntilDown(t testing.TB, tier HealthyTier, arena offload.Arena, slot int64, id uint64, timeout time.Duration) {
	t.Helper()
	Eventually(t, timeout, "tier unhealthy", func() bool {
		res := Run(t, tier, StoreJob(id, arena, Keys(int(id), 1), []int64{slot}))
		id++
		if res.Success {
			t.Fatalf("store succeeded with the server down")
		}
		return !tier.Healthy()
	})
}

// WaitJobs polls tier.FinishedJobs until n results arrived or timeout
// passes, failing the test on timeout or on a duplicate job id.
func WaitJobs(t testing.TB, tier offload.SecondaryTier, n int, timeout time.Duration) []offload.JobResult {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var out []offload.JobResult
	seen := map[uint64]bool{}
	idleBefore := false
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
		// adds no polling latency (benchmarks use this too): the results
		// are taken right after. Only a tier that reports nothing pending
		// yet has not published its result is polled, every millisecond.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
		idle := tier.DrainJobs(ctx) == nil && !tier.HasPendingWork()
		cancel()
		if idle && idleBefore {
			time.Sleep(time.Millisecond)
		}
		idleBefore = idle
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

// CheckTakenBack stores three blocks of arena (slots 0–2, as keys) with
// the middle one taken back by the manager before the tier reads it
// (offload.Claims) and checks that the job succeeds, that the tier finds
// the other two and not the middle one, and that its stored event, if
// it emits events, announces the other two only.
func CheckTakenBack(t testing.TB, tier offload.SecondaryTier, arena offload.Arena, keys []offload.Key, events bool) {
	t.Helper()
	if c, ok := tier.(offload.BlockClaimer); !ok || !c.ClaimsBlocks() {
		t.Fatal("the tier does not claim blocks")
	}
	job := StoreJob(1, arena, keys[:3], Slots(0, 3))
	job.Claims = offload.NewClaims(3)
	job.Claims.Revoke(1)
	if res := Run(t, tier, job); !res.Success || res.Bytes != 2*int64(arena.SlotSize()) {
		t.Fatalf("store with a block taken back: %+v, want success with two blocks", res)
	}
	req, _ := offload.NewReqContext("taken-back", nil)
	for i, want := range []offload.LookupResult{offload.Hit, offload.Miss, offload.Hit} {
		if r := Resolve(t, tier, keys[i], req); r != want {
			t.Fatalf("lookup of block %d: %v, want %v", i, r, want)
		}
	}
	if !events {
		return
	}
	if evs := tier.TakeEvents(); len(evs) != 1 || len(evs[0].Keys) != 2 || evs[0].Keys[0] != keys[0] || evs[0].Keys[1] != keys[2] {
		t.Fatalf("events %+v, want one announcing blocks 0 and 2", evs)
	}
}
