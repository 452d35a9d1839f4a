package tiering

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/kvtier/kvtier/cpu"
	"github.com/kvtier/kvtier/offload"
)

// callLog records calls across tiers (and the primary's finish, which the
// manager does not forward) so that tests can assert their order.
type callLog struct{ calls []string }

func (l *callLog) add(format string, args ...any) {
	if l != nil {
		l.calls = append(l.calls, fmt.Sprintf(format, args...))
	}
}

// fakeTier is a recording secondary tier in the style of upstream's example
// tier: it holds key presence only, completes jobs synchronously unless
// hold is set, and can be told to fail or panic.
type fakeTier struct {
	name     string
	medium   offload.Medium
	locality offload.Locality
	policy   offload.OffloadPolicy
	log      *callLog

	blocks map[offload.Key]bool

	// Behaviour knobs.
	retry      bool                 // Lookup answers Retry for absent keys
	hold       bool                 // keep jobs until release()
	failStores bool                 // store jobs fail
	partial    int                  // >0: loads succeed for this many keys only
	refuse     map[offload.Key]bool // stores succeed without these keys (their node down)
	dur        time.Duration        // reported job duration
	panics     map[string]bool      // method name → panic in it
	extra      []offload.JobResult

	// Recordings.
	lookups      []lookupCall
	stores       []*offload.Job
	loads        []*offload.Job
	touches      [][]offload.Key
	touchReqs    []*offload.ReqContext
	drains       int
	finishedReqs []*offload.ReqContext
	takeEvents   int
	scheduleEnds int
	events       []offload.Event

	held    []*offload.Job
	results []offload.JobResult
}

type lookupCall struct {
	key offload.Key
	req *offload.ReqContext
}

func newFake(name string, medium offload.Medium, locality offload.Locality, log *callLog) *fakeTier {
	return &fakeTier{name: name, medium: medium, locality: locality, log: log, blocks: map[offload.Key]bool{}, panics: map[string]bool{}}
}

func (f *fakeTier) maybePanic(call string) {
	if f.panics[call] {
		panic(f.name + ": injected panic in " + call)
	}
}

func (f *fakeTier) Name() string               { return f.name }
func (f *fakeTier) Type() string               { return "fake" }
func (f *fakeTier) Medium() offload.Medium     { return f.medium }
func (f *fakeTier) Locality() offload.Locality { return f.locality }
func (f *fakeTier) HasPendingWork() bool {
	f.maybePanic("HasPendingWork")
	return len(f.held)+len(f.results) > 0
}
func (f *fakeTier) OnScheduleEnd(offload.ScheduleEnd) {
	f.maybePanic("OnScheduleEnd")
	f.scheduleEnds++
}

func (f *fakeTier) Lookup(key offload.Key, req *offload.ReqContext) offload.LookupResult {
	f.lookups = append(f.lookups, lookupCall{key, req})
	f.maybePanic("Lookup")
	if f.blocks[key] {
		return offload.Hit
	}
	if f.retry {
		return offload.Retry
	}
	return offload.Miss
}

func (f *fakeTier) SubmitStore(job *offload.Job) {
	f.log.add("submit_store_%s", f.name)
	f.stores = append(f.stores, job)
	f.maybePanic("SubmitStore")
	f.accept(job)
}

func (f *fakeTier) SubmitLoad(job *offload.Job) {
	f.loads = append(f.loads, job)
	f.maybePanic("SubmitLoad")
	f.accept(job)
}

func (f *fakeTier) accept(job *offload.Job) {
	if f.hold {
		f.held = append(f.held, job)
		return
	}
	f.complete(job)
}

func (f *fakeTier) complete(job *offload.Job) {
	r := offload.JobResult{JobID: job.ID, Success: true, Duration: f.dur}
	if job.Promotion {
		for i, k := range job.Keys {
			if !f.blocks[k] || (f.partial > 0 && i >= f.partial) {
				r.Success = false
				if i > 0 {
					r.SuccessfulKeys = job.Keys[:i]
				}
				break
			}
		}
	} else if f.failStores {
		r.Success = false
	} else {
		for _, k := range job.Keys {
			if f.refuse[k] {
				r.Refused++
				continue
			}
			f.blocks[k] = true
		}
	}
	f.results = append(f.results, r)
}

// release completes every held job.
func (f *fakeTier) release() {
	held := f.held
	f.held = nil
	for _, j := range held {
		f.complete(j)
	}
}

func (f *fakeTier) FinishedJobs() []offload.JobResult {
	f.maybePanic("FinishedJobs")
	r := append(f.results, f.extra...)
	f.results, f.extra = nil, nil
	return r
}

func (f *fakeTier) DrainJobs(context.Context) error {
	f.drains++
	f.maybePanic("DrainJobs")
	f.release()
	return nil
}

func (f *fakeTier) Touch(keys []offload.Key, req *offload.ReqContext) {
	f.maybePanic("Touch")
	f.touches = append(f.touches, slices.Clone(keys))
	f.touchReqs = append(f.touchReqs, req)
}

func (f *fakeTier) OnNewRequest(*offload.ReqContext) offload.OffloadPolicy {
	f.maybePanic("OnNewRequest")
	return f.policy
}

func (f *fakeTier) OnRequestFinished(req *offload.ReqContext) {
	f.log.add("secondary_finish_%s", f.name)
	f.finishedReqs = append(f.finishedReqs, req)
	f.maybePanic("OnRequestFinished")
}

func (f *fakeTier) TakeEvents() []offload.Event {
	f.takeEvents++
	f.maybePanic("TakeEvents")
	ev := f.events
	f.events = nil
	return ev
}

func (f *fakeTier) Close(context.Context) error {
	f.maybePanic("Close")
	f.release()
	return nil
}

// fixture is the upstream test fixture: a 5-slot primary and two
// secondary tiers declared CPU (docs/semantics.md §7.B).
type fixture struct {
	t      *testing.T
	m      *Manager
	p      *cpu.Primary
	t1, t2 *fakeTier
	log    *callLog
	ctx    *offload.ReqContext
	closed bool
}

const testSlotSize = 16

func newPrimary(t testing.TB, slots int) *cpu.Primary {
	t.Helper()
	p, err := cpu.New(cpu.Config{SlotSize: testSlotSize, Capacity: int64(slots * testSlotSize), Events: true})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func newFixture(t *testing.T, opts ...func(*Config)) *fixture {
	t.Helper()
	log := &callLog{}
	f := &fixture{t: t, log: log, ctx: &offload.ReqContext{ID: "test", LoadFilter: offload.All(), StoreFilter: offload.All()}}
	f.p = newPrimary(t, 5)
	f.t1 = newFake("1", offload.MediumCPU, offload.LocalityUnspecified, log)
	f.t2 = newFake("2", offload.MediumCPU, offload.LocalityUnspecified, log)
	cfg := Config{Primary: f.p, Tiers: []offload.SecondaryTier{f.t1, f.t2}}
	for _, o := range opts {
		o(&cfg)
	}
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	f.m = m
	t.Cleanup(func() {
		if !f.closed {
			_ = m.Close(context.Background())
		}
	})
	return f
}

func K(n int) offload.Key { return offload.MakeKey([]byte(fmt.Sprint(n)), 0) }

func keyRange(from, to int) []offload.Key {
	var ks []offload.Key
	for i := from; i < to; i++ {
		ks = append(ks, K(i))
	}
	return ks
}

func reqWith(id string, load, store *offload.TierFilter) *offload.ReqContext {
	if load == nil {
		load = offload.All()
	}
	if store == nil {
		store = offload.All()
	}
	return &offload.ReqContext{ID: id, LoadFilter: load, StoreFilter: store}
}

// store runs prepare+complete for keys under req (which must be known).
func (f *fixture) store(req *offload.ReqContext, keys []offload.Key) offload.PrepareStoreOutput {
	f.t.Helper()
	out, ok, err := f.m.PrepareStore(keys, req)
	if err != nil || !ok {
		f.t.Fatalf("prepare store %v: ok=%v err=%v", keys, ok, err)
	}
	if err := f.m.CompleteStore(out.KeysToStore, req, true); err != nil {
		f.t.Fatal(err)
	}
	return out
}

func (f *fixture) lookups(req *offload.ReqContext, keys []offload.Key) []offload.LookupResult {
	out := make([]offload.LookupResult, len(keys))
	for i, k := range keys {
		out[i] = f.m.Lookup(k, req)
	}
	return out
}

func (f *fixture) step() { f.m.ScheduleEnd(offload.ScheduleEnd{}) }

func (f *fixture) ref(k offload.Key) int32 {
	f.t.Helper()
	r, ok := f.p.RefCount(k)
	if !ok {
		f.t.Fatalf("%v not in primary", k)
	}
	return r
}

func rs(rs ...offload.LookupResult) []offload.LookupResult { return rs }
