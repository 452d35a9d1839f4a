package remote

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvtier/kvtier/offload"
)

// memArena is a heap arena for Base's tests.
type memArena struct{ slots [][]byte }

func (a *memArena) SlotSize() int { return len(a.slots[0]) }
func (a *memArena) NumSlots() int { return len(a.slots) }
func (a *memArena) Slot(i int64) ([]byte, error) {
	if i < 0 || i >= int64(len(a.slots)) {
		return nil, fmt.Errorf("slot %d: %w", i, offload.ErrSlotOutOfRange)
	}
	return a.slots[i], nil
}

// fakeBackend stores blocks in a map and fails the keys in bad.
type fakeBackend struct {
	mu     sync.Mutex
	blocks map[offload.Key]byte
	bad    map[offload.Key]bool
	down   map[offload.Key]bool // on a node that is down: refused
}

func (f *fakeBackend) exists(_ context.Context, keys []offload.Key) ([]bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]bool, len(keys))
	for i, k := range keys {
		_, out[i] = f.blocks[k]
	}
	return out, nil
}

func (f *fakeBackend) store(_ context.Context, job *offload.Job) ([]Fate, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var fates []Fate
	mark := func(i int, fate Fate) {
		if fates == nil {
			fates = make([]Fate, len(job.Keys))
		}
		fates[i] = fate
	}
	for i, k := range job.Keys {
		if f.bad[k] {
			return nil, fmt.Errorf("store %s: refused", k)
		}
		if f.down[k] {
			mark(i, NodeDown)
			continue
		}
		s, err := job.Arena.Slot(job.Slots[i])
		if err != nil {
			return nil, err
		}
		if !job.Claim(i) {
			mark(i, TakenBack)
			continue
		}
		f.blocks[k] = s[0]
		job.Release(i)
	}
	return fates, nil
}

func (f *fakeBackend) load(_ context.Context, job *offload.Job, slots [][]byte, errs []error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, k := range job.Keys {
		if slots[i] == nil {
			continue
		}
		b, ok := f.blocks[k]
		if !ok || f.bad[k] {
			errs[i] = fmt.Errorf("load %s: not found", k)
			continue
		}
		slots[i][0] = b
	}
}

func newTestBase(t *testing.T, events bool) (*Base, *fakeBackend, *Health) {
	t.Helper()
	f := &fakeBackend{blocks: map[offload.Key]byte{}, bad: map[offload.Key]bool{}}
	h := NewHealth("t", func(context.Context) error { return errors.New("still down") },
		HealthOptions{Threshold: 1, Interval: time.Hour, Logger: slog.New(slog.DiscardHandler)})
	var ev *Events
	if events {
		ev = NewEvents("t", offload.MediumCPU, offload.LocalityRemote, 0)
	}
	b := NewBase(BaseConfig{
		Name: "t", Label: `test tier "t"`, Medium: offload.MediumCPU, Locality: offload.LocalityRemote,
		Health: h, Counters: new(Counters), Events: ev, MaxInflight: 8,
		Exists: f.exists, Logger: slog.New(slog.DiscardHandler),
		Store: f.store, Load: f.load,
	})
	t.Cleanup(func() { b.Close(context.Background()) })
	return b, f, h
}

func results(t *testing.T, b *Base, n int) map[uint64]offload.JobResult {
	t.Helper()
	if err := b.DrainJobs(context.Background()); err != nil {
		t.Fatal(err)
	}
	out := map[uint64]offload.JobResult{}
	for _, r := range b.FinishedJobs() {
		if _, dup := out[r.JobID]; dup {
			t.Fatalf("job %d answered twice", r.JobID)
		}
		out[r.JobID] = r
	}
	if len(out) != n {
		t.Fatalf("%d results, want %d: %+v", len(out), n, out)
	}
	return out
}

// resolve looks key up until the answer is not Retry.
func resolve(t *testing.T, b *Base, key offload.Key, req *offload.ReqContext) offload.LookupResult {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if r := b.Lookup(key, req); r != offload.Retry {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("lookup of %s still Retry", key)
		}
		b.OnScheduleEnd(offload.ScheduleEnd{})
		time.Sleep(time.Millisecond)
	}
}

func TestBaseStoreLookupLoad(t *testing.T) {
	b, f, _ := newTestBase(t, true)
	arena := &memArena{slots: [][]byte{{1, 0}, {2, 0}, {3, 0}, {0, 0}}}
	keys := []offload.Key{"k0-hash", "k1-hash", "k2-hash"}
	req := offload.Background("r")

	// A miss is cached until a store of the key makes the tier probe again.
	if r := resolve(t, b, keys[0], req); r != offload.Miss {
		t.Fatalf("lookup before store: %v", r)
	}
	b.SubmitStore(&offload.Job{ID: 1, Keys: keys, Slots: []int64{0, 1, 2}, Arena: arena})
	b.SubmitStore(&offload.Job{ID: 2, Arena: arena})                      // empty: succeeds
	b.SubmitStore(&offload.Job{ID: 3, Keys: keys[:1], Slots: []int64{0}}) // no arena
	res := results(t, b, 3)
	if r := res[1]; !r.Success || r.Bytes != 6 || r.Err != nil {
		t.Fatalf("store: %+v", r)
	}
	if r := res[2]; !r.Success || r.Bytes != 0 {
		t.Fatalf("empty store: %+v", r)
	}
	if r := res[3]; r.Success || r.Err == nil || !strings.Contains(r.Err.Error(), "no arena") {
		t.Fatalf("store without arena: %+v", r)
	}
	evs := b.TakeEvents()
	if len(evs) != 1 || evs[0].Removed || len(evs[0].Keys) != 3 || evs[0].Tier != "t" || evs[0].Medium != offload.MediumCPU || evs[0].Locality != offload.LocalityRemote {
		t.Fatalf("events %+v", evs)
	}
	if r := resolve(t, b, keys[0], req); r != offload.Hit {
		t.Fatalf("lookup after store: %v", r)
	}

	// A partial load reports the keys that arrived (a bad block fails
	// alone); the failed key is a Miss for the request without another
	// probe, the bad slot fails only its key.
	f.bad[keys[1]] = true
	for _, k := range keys {
		resolve(t, b, k, req)
	}
	b.SubmitLoad(&offload.Job{ID: 4, Keys: keys, Slots: []int64{3, 3, 3}, Arena: arena, Promotion: true, Req: req})
	b.SubmitLoad(&offload.Job{ID: 5, Keys: keys[2:], Slots: []int64{9}, Arena: arena, Promotion: true, Req: req})
	res = results(t, b, 2)
	if r := res[4]; r.Success || len(r.SuccessfulKeys) != 2 || r.SuccessfulKeys[0] != keys[0] || r.SuccessfulKeys[1] != keys[2] || r.Bytes != 4 {
		t.Fatalf("partial load: %+v", r)
	}
	if r := res[5]; r.Success || !errors.Is(r.Err, offload.ErrSlotOutOfRange) || r.SuccessfulKeys != nil {
		t.Fatalf("load into a bad slot: %+v", r)
	}
	if r := b.Lookup(keys[1], req); r != offload.Miss {
		t.Fatalf("lookup of a key that failed to load: %v", r)
	}
	st := b.Stats()
	if st.StoreJobsOK != 2 || st.StoreJobsFailed != 1 || st.LoadJobsFailed != 2 || !st.Healthy || st.InFlightJobs != 0 {
		t.Fatalf("stats %+v", st)
	}
	b.OnRequestFinished(req)
	if b.HasPendingWork() {
		t.Fatal("pending work when idle")
	}
}

// A block the manager took back is not stored, nor announced, nor
// counted in the job's bytes; the job succeeds with the others.
func TestBaseStoreSkipsBlocksTakenBack(t *testing.T) {
	b, f, _ := newTestBase(t, true)
	if !b.ClaimsBlocks() {
		t.Fatal("Base does not claim blocks")
	}
	arena := &memArena{slots: [][]byte{{1, 0}, {2, 0}, {3, 0}}}
	keys := []offload.Key{"k0-hash", "k1-hash", "k2-hash"}
	claims := offload.NewClaims(3)
	claims.Revoke(1)
	b.SubmitStore(&offload.Job{ID: 1, Keys: keys, Slots: []int64{0, 1, 2}, Arena: arena, Claims: claims})
	if r := results(t, b, 1)[1]; !r.Success || r.Bytes != 4 {
		t.Fatalf("store: %+v, want success with 2 blocks of 2 bytes", r)
	}
	if _, ok := f.blocks[keys[1]]; ok || len(f.blocks) != 2 {
		t.Fatalf("stored %v", f.blocks)
	}
	if evs := b.TakeEvents(); len(evs) != 1 || len(evs[0].Keys) != 2 || evs[0].Keys[0] != keys[0] || evs[0].Keys[1] != keys[2] {
		t.Fatalf("events %+v, want keys 0 and 2", evs)
	}
}

// Blocks refused because their node is down are neither stored nor
// announced; the job succeeds with the others and reports how many it
// refused; a job whose every block was refused is a tier_down refusal.
func TestBaseStoreRefusesBlocksOfADownNode(t *testing.T) {
	b, f, _ := newTestBase(t, true)
	arena := &memArena{slots: [][]byte{{1, 0}, {2, 0}, {3, 0}}}
	keys := []offload.Key{"k0-hash", "k1-hash", "k2-hash"}
	f.down = map[offload.Key]bool{keys[1]: true}
	b.SubmitStore(&offload.Job{ID: 1, Keys: keys, Slots: []int64{0, 1, 2}, Arena: arena})
	if r := results(t, b, 1)[1]; !r.Success || r.Refused != 1 || r.Bytes != 4 {
		t.Fatalf("store: %+v, want success with 2 blocks of 2 bytes and 1 refused", r)
	}
	if evs := b.TakeEvents(); len(evs) != 1 || len(evs[0].Keys) != 2 || evs[0].Keys[0] != keys[0] || evs[0].Keys[1] != keys[2] {
		t.Fatalf("events %+v, want keys 0 and 2", evs)
	}
	f.down = map[offload.Key]bool{keys[0]: true, keys[1]: true}
	b.SubmitStore(&offload.Job{ID: 2, Keys: keys[:2], Slots: []int64{0, 1}, Arena: arena})
	r := results(t, b, 1)[2]
	if reason, ok := offload.RefusalReason(r.Err); r.Success || !ok || reason != offload.RefusedTierDown || !errors.Is(r.Err, ErrUnavailable) {
		t.Fatalf("store of refused blocks only: %+v, want a tier_down refusal", r)
	}
	if st := b.Stats(); st.BlocksNodeDown != 3 || st.StoreJobsOK != 1 || st.StoreJobsSkipped != 1 {
		t.Fatalf("stats %+v", st)
	}
	if evs := b.TakeEvents(); len(evs) != 0 {
		t.Fatalf("events %+v after a refused job", evs)
	}
}

func TestBaseUnhealthyAndClosed(t *testing.T) {
	b, _, h := newTestBase(t, false)
	h.Failure(errors.New("connection refused"))
	req := offload.Background("r")
	arena := &memArena{slots: [][]byte{{0}}}
	if r := b.Lookup("key-hash", req); r != offload.Miss {
		t.Fatalf("lookup while down: %v", r)
	}
	b.SubmitStore(&offload.Job{ID: 1, Keys: []offload.Key{"key-hash"}, Slots: []int64{0}, Arena: arena})
	b.SubmitLoad(&offload.Job{ID: 2, Keys: []offload.Key{"key-hash"}, Slots: []int64{0}, Arena: arena, Promotion: true, Req: req})
	for _, r := range results(t, b, 2) {
		if r.Success || !errors.Is(r.Err, ErrUnavailable) {
			t.Fatalf("job while down: %+v", r)
		}
	}
	st := b.Stats()
	if st.Healthy || st.StoreJobsSkipped != 1 || st.LoadJobsSkipped != 1 || st.LookupsUnhealthy != 1 || st.Downs != 1 {
		t.Fatalf("stats %+v", st)
	}
	if evs := b.TakeEvents(); evs != nil {
		t.Fatalf("events with events off: %+v", evs)
	}
	if err := b.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(context.Background()); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

func TestSharedCheck(t *testing.T) {
	ok := Shared{MaxInflight: 1, UnhealthyAfter: 1, LookupBatch: 1, Timeout: 1, LookupTimeout: 1, RetryBackoff: 1, ProbeInterval: 1}
	own := []Count{{"pool_size", 4}}
	dial := []Span{{"dial_timeout", time.Second}}
	cases := []struct {
		name string
		mod  func(*Shared)
		own  []Count
		dial []Span
		want string // "" for no error
	}{
		{"ok", func(*Shared) {}, own, dial, ""},
		{"no extras", func(*Shared) {}, nil, nil, ""},
		{"own count", func(*Shared) {}, []Count{{"pool_size", 0}}, dial, "pool_size: must be > 0, got 0"},
		{"max_inflight", func(s *Shared) { s.MaxInflight = -1 }, own, dial, "max_inflight: must be > 0, got -1"},
		{"lookup_batch", func(s *Shared) { s.LookupBatch = 0 }, own, dial, "lookup_batch: must be > 0, got 0"},
		{"retries", func(s *Shared) { s.Retries = -1 }, own, dial, "retries: must be >= 0, got -1"},
		{"own span", func(*Shared) {}, own, []Span{{"dial_timeout", -time.Second}}, "dial_timeout: must be > 0, got -1s"},
		{"probe_interval", func(s *Shared) { s.ProbeInterval = 0 }, own, dial, "probe_interval: must be > 0, got 0s"},
		// The first problem in order wins: counts, retries, durations.
		{"order", func(s *Shared) { s.Timeout, s.Retries, s.UnhealthyAfter = 0, -1, 0 }, own, []Span{{"dial_timeout", 0}}, "unhealthy_after:"},
		{"own count first", func(s *Shared) { s.MaxInflight = 0 }, []Count{{"io_threads", -1}}, nil, "io_threads:"},
		{"retries before spans", func(s *Shared) { s.Retries = -1 }, own, []Span{{"dial_timeout", 0}}, "retries:"},
		{"own span first", func(s *Shared) { s.Timeout = 0 }, own, []Span{{"dial_timeout", 0}}, "dial_timeout:"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := ok
			tc.mod(&s)
			err := s.Check(tc.own, tc.dial)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("unexpected %v", err)
				}
				return
			}
			if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
		})
	}
	// One parser for every tier (confvalue's): global, a request filter's
	// synonym of remote, names no tier's placement.
	if _, err := ParseLocality("Global"); err == nil {
		t.Fatal("global accepted as a tier's locality")
	}
	if l, err := ParseLocality(""); err != nil || l != offload.LocalityUnspecified {
		t.Fatalf("empty: %v %v", l, err)
	}
	if _, err := ParseLocality("moon"); err == nil || !strings.Contains(err.Error(), `"moon"`) {
		t.Fatalf("moon: %v", err)
	}
}

// TestBasePanicIsAFailedJob: a StoreFunc or LoadFunc that panics fails
// its job like any error: counted, and the load's keys answer Miss for
// the request instead of being promoted again.
func TestBasePanicIsAFailedJob(t *testing.T) {
	b, f, _ := newTestBase(t, false)
	b.store = func(context.Context, *offload.Job) ([]Fate, error) { panic("store bug") }
	b.load = func(context.Context, *offload.Job, [][]byte, []error) { panic("load bug") }
	arena := &memArena{slots: [][]byte{{0}, {0}}}
	k := offload.Key("key-hash")
	f.blocks[k] = 1
	req := offload.Background("r")
	if r := resolve(t, b, k, req); r != offload.Hit {
		t.Fatalf("lookup %v", r)
	}
	b.SubmitStore(&offload.Job{ID: 1, Keys: []offload.Key{k}, Slots: []int64{0}, Arena: arena})
	b.SubmitLoad(&offload.Job{ID: 2, Keys: []offload.Key{k}, Slots: []int64{1}, Arena: arena, Promotion: true, Req: req})
	for id, r := range results(t, b, 2) {
		if r.Success || r.Err == nil || !strings.Contains(r.Err.Error(), "panic") {
			t.Fatalf("job %d: %+v", id, r)
		}
	}
	if st := b.Stats(); st.StoreJobsFailed != 1 || st.LoadJobsFailed != 1 {
		t.Fatalf("stats %+v", st)
	}
	if r := b.Lookup(k, req); r != offload.Miss {
		t.Fatalf("lookup after a load that panicked: %v", r)
	}
}
