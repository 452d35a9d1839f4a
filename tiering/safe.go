package tiering

import (
	"context"
	"fmt"
	"runtime/debug"

	"github.com/kvtier/kvtier/offload"
)

// Every call into a secondary tier goes through one of the wrappers below.
// A tier that panics must not take the daemon down or leave a pin behind:
// the panic is recovered, logged with its stack and counted, and the call
// is treated as the neutral answer (Miss, no results, no events) or, for a
// submission, as a failed job.

// recoverTier is deferred directly by the wrappers so that recover works.
func (s *Stack) recoverTier(ts *tier, call string) {
	if p := recover(); p != nil {
		ts.stats.Panics++
		s.log.Error("tiering: secondary tier panicked", "tier", ts.name, "call", call,
			"panic", fmt.Sprint(p), "stack", string(debug.Stack()))
	}
}

func (s *Stack) tierLookup(ts *tier, key offload.Key, req *offload.ReqContext) (r offload.LookupResult) {
	defer s.recoverTier(ts, "Lookup")
	return ts.t.Lookup(key, req)
}

// tierSubmit hands a job to ts and reports false if the tier panicked.
func (s *Stack) tierSubmit(ts *tier, j *offload.Job) (ok bool) {
	if j.Promotion {
		defer s.recoverTier(ts, "SubmitLoad")
		ts.t.SubmitLoad(j)
	} else {
		defer s.recoverTier(ts, "SubmitStore")
		ts.t.SubmitStore(j)
	}
	return true
}

func (s *Stack) tierFinished(ts *tier) (r []offload.JobResult) {
	defer s.recoverTier(ts, "FinishedJobs")
	return ts.t.FinishedJobs()
}

func (s *Stack) tierDrain(ctx context.Context, ts *tier) (err error) {
	defer func() {
		if p := recover(); p != nil {
			s.recoverTierValue(ts, "DrainJobs", p)
			err = fmt.Errorf("drain panicked: %v", p)
		}
	}()
	return ts.t.DrainJobs(ctx)
}

func (s *Stack) tierClose(ctx context.Context, ts *tier) (err error) {
	defer func() {
		if p := recover(); p != nil {
			s.recoverTierValue(ts, "Close", p)
			err = fmt.Errorf("close panicked: %v", p)
		}
	}()
	return ts.t.Close(ctx)
}

func (s *Stack) recoverTierValue(ts *tier, call string, p any) {
	ts.stats.Panics++
	s.log.Error("tiering: secondary tier panicked", "tier", ts.name, "call", call,
		"panic", fmt.Sprint(p), "stack", string(debug.Stack()))
}

func (s *Stack) tierHasPendingWork(ts *tier) (b bool) {
	defer s.recoverTier(ts, "HasPendingWork")
	return ts.t.HasPendingWork()
}

func (s *Stack) tierTouch(ts *tier, keys []offload.Key, req *offload.ReqContext) {
	defer s.recoverTier(ts, "Touch")
	ts.t.Touch(keys, req)
}

func (s *Stack) tierOnNewRequest(ts *tier, req *offload.ReqContext) (p offload.OffloadPolicy) {
	defer s.recoverTier(ts, "OnNewRequest")
	return ts.t.OnNewRequest(req)
}

func (s *Stack) tierOnRequestFinished(ts *tier, req *offload.ReqContext) {
	defer s.recoverTier(ts, "OnRequestFinished")
	ts.t.OnRequestFinished(req)
}

func (s *Stack) tierScheduleEnd(ts *tier, se offload.ScheduleEnd) {
	defer s.recoverTier(ts, "OnScheduleEnd")
	ts.t.OnScheduleEnd(se)
}

func (s *Stack) tierTakeEvents(ts *tier) (ev []offload.Event) {
	defer s.recoverTier(ts, "TakeEvents")
	return ts.t.TakeEvents()
}

func (s *Stack) tierQueued(ts *tier) (queued, capacity int) {
	defer s.recoverTier(ts, "QueuedJobs")
	return ts.queue.QueuedJobs()
}

// tierCancel reports false when the tier panicked: the job is then
// assumed to be still in its hands.
func (s *Stack) tierCancel(ts *tier, id uint64) (ok bool) {
	defer s.recoverTier(ts, "CancelQueued")
	return ts.queue.CancelQueued(id)
}

// tierHolds asks h, reporting false if the tier panicked.
func (s *Stack) tierHolds(ts *tier, h Holder, keys []offload.Key, held []bool) (ok bool) {
	defer s.recoverTier(ts, "Holds")
	h.Holds(keys, held)
	return true
}

// tierDelete asks d to delete keys, reporting a panic as an error.
func (s *Stack) tierDelete(ctx context.Context, ts *tier, d Deleter, keys []offload.Key) (n int, err error) {
	err = errTierPanicked
	defer s.recoverTier(ts, "Delete")
	return d.Delete(ctx, keys)
}
