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
func (m *Manager) recoverTier(ts *tier, call string) {
	if p := recover(); p != nil {
		ts.stats.Panics++
		m.log.Error("tiering: secondary tier panicked", "tier", ts.name, "call", call,
			"panic", fmt.Sprint(p), "stack", string(debug.Stack()))
	}
}

func (m *Manager) tierLookup(ts *tier, key offload.Key, req *offload.ReqContext) (r offload.LookupResult) {
	defer m.recoverTier(ts, "Lookup")
	return ts.t.Lookup(key, req)
}

// tierSubmit hands a job to ts and reports false if the tier panicked.
func (m *Manager) tierSubmit(ts *tier, j *offload.Job) (ok bool) {
	if j.Promotion {
		defer m.recoverTier(ts, "SubmitLoad")
		ts.t.SubmitLoad(j)
	} else {
		defer m.recoverTier(ts, "SubmitStore")
		ts.t.SubmitStore(j)
	}
	return true
}

func (m *Manager) tierFinished(ts *tier) (r []offload.JobResult) {
	defer m.recoverTier(ts, "FinishedJobs")
	return ts.t.FinishedJobs()
}

func (m *Manager) tierDrain(ctx context.Context, ts *tier) (err error) {
	defer func() {
		if p := recover(); p != nil {
			m.recoverTierValue(ts, "DrainJobs", p)
			err = fmt.Errorf("drain panicked: %v", p)
		}
	}()
	return ts.t.DrainJobs(ctx)
}

func (m *Manager) tierClose(ctx context.Context, ts *tier) (err error) {
	defer func() {
		if p := recover(); p != nil {
			m.recoverTierValue(ts, "Close", p)
			err = fmt.Errorf("close panicked: %v", p)
		}
	}()
	return ts.t.Close(ctx)
}

func (m *Manager) recoverTierValue(ts *tier, call string, p any) {
	ts.stats.Panics++
	m.log.Error("tiering: secondary tier panicked", "tier", ts.name, "call", call,
		"panic", fmt.Sprint(p), "stack", string(debug.Stack()))
}

func (m *Manager) tierHasPendingWork(ts *tier) (b bool) {
	defer m.recoverTier(ts, "HasPendingWork")
	return ts.t.HasPendingWork()
}

func (m *Manager) tierTouch(ts *tier, keys []offload.Key, req *offload.ReqContext) {
	defer m.recoverTier(ts, "Touch")
	ts.t.Touch(keys, req)
}

func (m *Manager) tierOnNewRequest(ts *tier, req *offload.ReqContext) (p offload.OffloadPolicy) {
	defer m.recoverTier(ts, "OnNewRequest")
	return ts.t.OnNewRequest(req)
}

func (m *Manager) tierOnRequestFinished(ts *tier, req *offload.ReqContext) {
	defer m.recoverTier(ts, "OnRequestFinished")
	ts.t.OnRequestFinished(req)
}

func (m *Manager) tierScheduleEnd(ts *tier, se offload.ScheduleEnd) {
	defer m.recoverTier(ts, "OnScheduleEnd")
	ts.t.OnScheduleEnd(se)
}

func (m *Manager) tierTakeEvents(ts *tier) (ev []offload.Event) {
	defer m.recoverTier(ts, "TakeEvents")
	return ts.t.TakeEvents()
}
