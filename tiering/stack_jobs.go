// Per-tier jobs: submission bookkeeping, the once-per-step poll of every
// tier's finished jobs, each result applied exactly once (counters,
// latency histograms, back-pressure samples, the driver's callbacks), and
// the rate-limited warnings of failing tiers.

package tiering

import (
	"errors"
	"time"

	"github.com/kvtier/kvtier/offload"
)

// job is one submitted transfer.
type job struct {
	tier  *tier
	start time.Duration // submission time, since the stack's epoch (8 bytes, not 24)
	// gid names the cascade the job belongs to (0 for promotions).
	gid int32
	// released counts the blocks Revoke took back from this job (their
	// pins already released); they are the blocks j.Claims reports
	// revoked.
	released int32
	j        offload.Job
}

// initJob fills jb as a new job and registers it.
func (s *Stack) initJob(jb *job, ts *tier, keys []offload.Key, slots []int64, promotion bool, req *offload.ReqContext, now time.Time) *job {
	id := s.nextID
	s.nextID++
	*jb = job{tier: ts, start: now.Sub(s.epoch), j: offload.Job{ID: id, Keys: keys, Slots: slots, Promotion: promotion, Req: req, Arena: s.arena}}
	s.jobs[id] = jb
	return jb
}

// failSubmitted resolves a job whose submission panicked: the tier is
// assumed not to have taken it.
func (s *Stack) failSubmitted(jb *job, why string) {
	if _, ok := s.jobs[jb.j.ID]; !ok {
		return
	}
	delete(s.jobs, jb.j.ID)
	s.finishJob(jb, offload.JobResult{JobID: jb.j.ID, Err: errors.New(why)})
}

// Poll collects every tier's finished jobs, in tier order, applies them,
// and then cascades the deferred stores the freed budget takes.
func (s *Stack) Poll() {
	// The results were all collected now: one clock read dates them.
	s.finishedAt = time.Time{}
	defer func() { s.finishedAt = time.Time{} }()
	for _, ts := range s.tiers {
		for _, r := range s.tierFinished(ts) {
			jb, ok := s.jobs[r.JobID]
			if !ok || jb.tier != ts {
				if !ok && r.JobID < s.resetFloor {
					s.staleResults++
					continue
				}
				ts.stats.UnknownJobs++
				s.log.Error("tiering: tier reported a job it was not given", "tier", ts.name, "job", r.JobID)
				continue
			}
			delete(s.jobs, r.JobID)
			s.finishJob(jb, r)
		}
	}
	s.retryDeferred()
}

// latency is the time from a job's submission to its result: the
// duration the tier reports (which runs from its Submit call), or the
// time until the result was collected.
func (s *Stack) latency(jb *job, r offload.JobResult) time.Duration {
	if r.Duration > 0 {
		return r.Duration
	}
	if s.finishedAt.IsZero() {
		s.finishedAt = time.Now()
	}
	return s.finishedAt.Sub(s.epoch) - jb.start
}

// finishJob applies a job's result: counts it and hands it to the driver.
func (s *Stack) finishJob(jb *job, r offload.JobResult) {
	ts := jb.tier
	keys := jb.j.Keys
	if jb.j.Promotion {
		ts.load.observe(s.latency(jb, r))
		loaded := keys
		if !r.Success {
			loaded = Subsequence(keys, r.SuccessfulKeys)
			ts.stats.PromotionsFailed++
			ts.stats.PromotionBlocksFailed += uint64(len(keys) - len(loaded))
			s.warn(ts, "tiering: promotion failed", "job", r.JobID, "keys", len(keys), "loaded", len(loaded), "err", r.Err)
		} else {
			ts.stats.PromotionsOK++
		}
		ts.stats.PromotedBlocks += uint64(len(loaded))
		ts.stats.BytesIn += uint64(max(r.Bytes, 0))
		s.drv.PromotionDone(&jb.j, loaded)
		return
	}
	s.endCascade(jb)
	if !r.Success {
		if reason, ok := offload.RefusalReason(r.Err); ok {
			dr := DropQueueFull
			if reason == offload.RefusedTierDown {
				dr = DropTierDown
			}
			s.countDrop(ts, dr, len(keys))
			return
		}
		ts.store.observe(s.latency(jb, r))
		ts.stats.CascadesFailed++
		// Disk full, EIO, a server error: the operator must see these.
		s.warn(ts, "tiering: cascade failed", "job", r.JobID, "blocks", len(keys), "err", r.Err)
		return
	}
	d := s.latency(jb, r)
	ts.store.observe(d)
	ts.stats.CascadesOK++
	// Blocks the tier refused (their cluster node down) stay in the
	// primary only, like a dropped cascade's; one both refused and
	// revoked since is subtracted once.
	refused := min(max(r.Refused, 0), len(keys)-int(jb.released))
	ts.stats.CascadedBlocks += uint64(len(keys) - int(jb.released) - refused)
	ts.stats.CascadeBlocksDropped += uint64(refused)
	ts.stats.BytesOut += uint64(max(r.Bytes, 0))
	if s.adm.Disabled {
		return
	}
	if ts.pressure.sample(d, &s.adm) {
		state := "cleared"
		if ts.pressure.active {
			state = "activated"
		}
		s.log.Info("tiering: tier back-pressure "+state, "tier", ts.name, "index", ts.idx,
			"ema", time.Duration(ts.pressure.ema*float64(time.Second)))
	}
}

// Subsequence returns the keys of keys that appear, in order, in of: the
// loaded keys of a partial load whose SuccessfulKeys may be any
// subsequence of the job's keys (extras, or keys out of order, a tier
// must not report, are ignored).
func Subsequence(keys, of []offload.Key) []offload.Key {
	if len(of) == 0 {
		return nil
	}
	out := make([]offload.Key, 0, len(of))
	j := 0
	for _, k := range keys {
		if j < len(of) && of[j] == k {
			out = append(out, k)
			j++
		}
	}
	return out
}

// warn logs a tier failure at warning level, at most once per warnEvery
// per tier, with the count of those it kept quiet since.
func (s *Stack) warn(ts *tier, msg string, args ...any) {
	now := time.Now()
	if now.Sub(ts.warnedAt) < warnEvery {
		ts.quiet++
		return
	}
	if ts.quiet > 0 {
		args = append(args, "similar_since_last", ts.quiet)
	}
	ts.warnedAt, ts.quiet = now, 0
	s.log.Warn(msg, append([]any{"tier", ts.name}, args...)...)
}
