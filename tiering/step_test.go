package tiering

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kvtier/kvtier/offload"
)

// orderTier records the step-related calls the manager makes into a
// fakeTier, in order, so that tests can pin docs/semantics.md §4.8's sequence.
type orderTier struct {
	*fakeTier
	calls   []string
	pending bool // HasPendingWork answers true (an existence check in flight)
}

func (o *orderTier) FinishedJobs() []offload.JobResult {
	o.calls = append(o.calls, "finished_jobs")
	return o.fakeTier.FinishedJobs()
}

func (o *orderTier) SubmitLoad(job *offload.Job) {
	o.calls = append(o.calls, "submit_load")
	o.fakeTier.SubmitLoad(job)
}

func (o *orderTier) OnScheduleEnd(se offload.ScheduleEnd) {
	o.calls = append(o.calls, "schedule_end")
	o.fakeTier.OnScheduleEnd(se)
}

func (o *orderTier) HasPendingWork() bool { return o.pending || o.fakeTier.HasPendingWork() }

func (o *orderTier) take() []string {
	c := o.calls
	o.calls = nil
	return c
}

// TestScheduleEndOrder pins docs/semantics.md §4.8 and the once-per-step gate of §4.2:
// ScheduleEnd polls completions only if nothing polled this step, then
// resets the gate, flushes the step's promotions, and only then calls each
// tier's OnScheduleEnd (tiers flush their batched lookups there).
func TestScheduleEndOrder(t *testing.T) {
	p := newPrimary(t, 5)
	tier := &orderTier{fakeTier: newFake("1", offload.MediumCPU, offload.LocalityUnspecified, nil)}
	tier.blocks[K(0)] = true
	m, err := New(Config{Primary: p, Tiers: []offload.SecondaryTier{tier}})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close(t.Context())
	req := reqWith("r", nil, nil)

	// An idle step polls, then tells the tier.
	m.ScheduleEnd(offload.ScheduleEnd{})
	if diff := cmp.Diff([]string{"finished_jobs", "schedule_end"}, tier.take()); diff != "" {
		t.Errorf("idle step (-want +got):\n%s", diff)
	}
	// A lookup polls once for the step; a second lookup does not.
	if got := m.Lookup(K(0), req); got != offload.Retry {
		t.Fatalf("lookup = %v, want RETRY", got)
	}
	m.Lookup(K(1), req)
	if diff := cmp.Diff([]string{"finished_jobs"}, tier.take()); diff != "" {
		t.Errorf("lookups (-want +got):\n%s", diff)
	}
	// The step already polled: no second poll; the promotion is submitted
	// before the tier's OnScheduleEnd.
	m.ScheduleEnd(offload.ScheduleEnd{})
	if diff := cmp.Diff([]string{"submit_load", "schedule_end"}, tier.take()); diff != "" {
		t.Errorf("step with a promotion (-want +got):\n%s", diff)
	}
	// The gate was reset: the next lookup polls and sees the completion.
	if got := m.Lookup(K(0), req); got != offload.Hit {
		t.Errorf("lookup after the promotion completed = %v, want HIT", got)
	}
	if diff := cmp.Diff([]string{"finished_jobs"}, tier.take()); diff != "" {
		t.Errorf("lookup in the next step (-want +got):\n%s", diff)
	}
}

// TestHasPendingWork: pending work is a job in flight, a promotion not yet
// submitted, or a tier's own pending work (docs/semantics.md §4.9), and nothing once
// all of them are resolved.
func TestHasPendingWork(t *testing.T) {
	p := newPrimary(t, 5)
	tier := &orderTier{fakeTier: newFake("1", offload.MediumCPU, offload.LocalityUnspecified, nil)}
	tier.hold = true
	tier.blocks[K(9)] = true
	m, err := New(Config{Primary: p, Tiers: []offload.SecondaryTier{tier}})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close(t.Context())
	req := reqWith("r", nil, nil)
	m.OnNewRequest(req)
	want := func(what string, pending bool) {
		t.Helper()
		if got := m.HasPendingWork(); got != pending {
			t.Errorf("%s: HasPendingWork = %v, want %v", what, got, pending)
		}
	}
	want("fresh", false)

	tier.pending = true
	want("tier with its own work in flight", true)
	tier.pending = false

	if m.Lookup(K(9), req) != offload.Retry {
		t.Fatal("no promotion started")
	}
	want("promotion reserved, not submitted", true)
	m.ScheduleEnd(offload.ScheduleEnd{})
	want("promotion submitted, held by the tier", true)
	tier.release()
	m.ScheduleEnd(offload.ScheduleEnd{})
	want("promotion answered", false)

	out, ok, err := m.PrepareStore(keyRange(0, 2), req)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	want("engine store prepared (the engine's, not the manager's)", false)
	if err := m.CompleteStore(out.KeysToStore, req, true); err != nil {
		t.Fatal(err)
	}
	want("cascade in flight", true)
	tier.release()
	m.ScheduleEnd(offload.ScheduleEnd{})
	// PrepareStore polled this step, so the answer is read next step (§4.2).
	want("cascade answered, result not yet polled", true)
	m.ScheduleEnd(offload.ScheduleEnd{})
	want("cascade answered and polled", false)
	m.OnRequestFinished(req)
	want("request finished", false)
}
