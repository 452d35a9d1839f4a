package workload

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/kvtier/kvtier/offload"
)

// timedReq is one request of a timed replay between its arrival and its
// finish.
type timedReq struct {
	req     Request
	rc      *offload.ReqContext
	policy  offload.OffloadPolicy
	keys    []offload.Key
	out     []offload.LookupResult
	first   []offload.LookupResult
	arrived time.Time
	steps   int // steps waited
	// leased is the leading prefix that answered HIT at arrival, pinned
	// while the request waits so that waiting cannot cost it hits the
	// primary alone would have served.
	leased []offload.Key
	// stored are the keys PrepareStore reserved; CompleteStore runs at
	// the next step, as the engine's copy into the slots takes one.
	stored []offload.Key
}

// runTimed replays src at its arrival times (see Options.Timed). Each
// step, in the order vLLM's scheduler works: the stores prepared in the
// previous step complete and their requests finish; waiting requests look
// their prefix up again and are served once it settled (or their wait
// ran out); requests that arrived since the last step are announced and
// looked up, and served at once if nothing is pending; ScheduleEnd ends
// the step. Step k admits the requests that arrived by trace time
// k × Step × Speedup, so which requests share a step does not depend on
// the machine; steps start every Options.Step of wall time, and a step
// that overruns delays the next one (the lag is reported) rather than
// being skipped: only the tiers' speed against the clock varies.
func (d *driver) runTimed(ctx context.Context, src Source) (*Result, error) {
	start := time.Now()
	d.start = start
	n := len(d.m.Tiers())
	run := &timedRun{d: d, src: src, tr: &TimedResult{Speedup: d.opts.Speedup, Step: d.opts.Step}, first: -1,
		pool: make([]uint64, n), promoted: make([]uint64, n)}
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
	for k := 0; ; k++ {
		stopped := func(err error) error {
			return fmt.Errorf("workload: replay stopped after %d requests: %w", d.res.Requests, err)
		}
		if err := ctx.Err(); err != nil {
			return nil, stopped(err)
		}
		// Step k is due k steps after the start; one that starts after
		// that is behind by as much (the largest lateness is reported).
		due := start.Add(time.Duration(k) * d.opts.Step)
		behind := time.Duration(0)
		if wait := time.Until(due); wait > 0 {
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-ctx.Done():
				return nil, stopped(ctx.Err())
			}
		} else {
			behind = -wait
			run.tr.MaxBehind = max(run.tr.MaxBehind, behind)
		}
		if err := run.step(k); err != nil {
			return nil, err
		}
		d.progress(behind)
		if run.eof && len(run.waiting) == 0 && len(run.storing) == 0 {
			break
		}
	}
	d.drain(ctx)
	d.res.Elapsed = time.Since(start)
	if run.first >= 0 {
		run.tr.TraceSpan = time.Duration(run.last-run.first) * time.Millisecond
	}
	d.res.Timed = run.tr
	d.collect()
	return &d.res, nil
}

// timedRun is the state of a timed replay between its steps.
type timedRun struct {
	d           *driver
	src         Source
	tr          *TimedResult
	next        *Request // read from src, not arrived yet
	eof         bool
	first, last int64 // trace timestamps of the first and last arrival
	waiting     []*timedReq
	storing     []*timedReq
	newIDs      []string
	pool        []uint64 // promoted blocks not yet credited, per tier
	promoted    []uint64 // PromotedBlocks at the last step
}

// step runs step k: the promotions since the last step are credited, the
// last step's stores complete, the requests waiting on their lookups are
// served once settled (or out of patience), the requests due by now
// arrive, and the manager ends its step.
func (run *timedRun) step(k int) error {
	d, m := run.d, run.d.m
	now := time.Now()
	traceNow := int64(float64(time.Duration(k)*d.opts.Step) * d.opts.Speedup / float64(time.Millisecond))
	for i, st := range m.Stats().Tiers {
		run.pool[i] += st.PromotedBlocks - run.promoted[i]
		run.promoted[i] = st.PromotedBlocks
	}
	for _, r := range run.storing {
		if err := m.CompleteStore(r.stored, r.rc, true); err != nil {
			return fmt.Errorf("workload: request at trace line %d: %w", r.req.Line, err)
		}
		m.OnRequestFinished(r.rc)
	}
	clear(run.storing)
	run.storing = run.storing[:0]
	if err := run.serveWaiting(); err != nil {
		return err
	}
	if err := run.arrive(now, traceNow); err != nil {
		return err
	}
	run.tr.MaxWaiting = max(run.tr.MaxWaiting, len(run.waiting))
	m.ScheduleEnd(offload.ScheduleEnd{NewReqIDs: run.newIDs})
	d.res.Steps++
	d.takeEvents()
	return nil
}

// serveWaiting looks the waiting requests up again and serves those that
// settled, or waited WaitSteps steps.
func (run *timedRun) serveWaiting() error {
	d := run.d
	kept := run.waiting[:0]
	for _, r := range run.waiting {
		d.m.LookupPrefix(r.keys, r.rc, r.out)
		settled := isSettled(r.out)
		if r.steps++; !settled && r.steps < d.opts.WaitSteps {
			run.tr.WaitSteps++
			kept = append(kept, r)
			continue
		}
		if !settled {
			d.res.Unsettled++
		}
		if err := d.serveTimed(r, run.pool, &run.storing); err != nil {
			return err
		}
	}
	clear(run.waiting[len(kept):])
	run.waiting = kept
	return nil
}

// arrive admits the requests whose trace time is due by traceNow: each
// is looked up at once and served, or waits for its lookups to settle.
func (run *timedRun) arrive(now time.Time, traceNow int64) error {
	d := run.d
	run.newIDs = run.newIDs[:0]
	for !run.eof {
		if run.next == nil {
			req, err := run.src.Next()
			if errors.Is(err, io.EOF) {
				run.eof = true
				break
			}
			if err != nil {
				return fmt.Errorf("workload: after %d requests: %w", d.res.Requests, err)
			}
			run.next = &req
		}
		if run.first < 0 {
			run.first = run.next.Timestamp
		}
		if run.next.Timestamp-run.first > traceNow {
			break
		}
		run.last = run.next.Timestamp
		r := d.arrive(*run.next, now)
		run.next = nil
		run.newIDs = append(run.newIDs, r.rc.ID)
		if !isSettled(r.out) {
			if err := d.lease(r); err != nil {
				return err
			}
			run.waiting = append(run.waiting, r)
			continue
		}
		if err := d.serveTimed(r, run.pool, &run.storing); err != nil {
			return err
		}
	}
	return nil
}

// arrive announces req and looks its prefix up.
func (d *driver) arrive(req Request, now time.Time) *timedReq {
	d.seq++
	rc := new(offload.ReqContext)
	*rc = *d.tmpl // the parsed params are shared, read-only
	rc.ID = "r" + strconv.FormatUint(d.seq, 10)
	r := &timedReq{req: req, rc: rc, arrived: now}
	r.policy = d.m.OnNewRequest(rc)
	n := len(req.HashIDs)
	r.keys = make([]offload.Key, n)
	for i, id := range req.HashIDs {
		r.keys[i] = KeyOf(id)
	}
	r.out = make([]offload.LookupResult, n)
	r.first = make([]offload.LookupResult, n)
	d.m.LookupPrefix(r.keys, rc, r.out)
	copy(r.first, r.out)
	return r
}

// lease pins the prefix of r that answered HIT, for as long as r waits.
func (d *driver) lease(r *timedReq) error {
	n := leadingHits(r.out)
	if n == 0 {
		return nil
	}
	if _, err := d.m.PrepareLoad(r.keys[:n], r.rc); err != nil {
		return fmt.Errorf("workload: request at trace line %d: lease: %w", r.req.Line, err)
	}
	r.leased = r.keys[:n]
	return nil
}

// serveTimed counts r's hits (crediting promoted ones to tiers from
// pool), loads the hit prefix and prepares the store of the rest, which
// completes at the next step; a request with nothing to store finishes
// now.
func (d *driver) serveTimed(r *timedReq, pool []uint64, storing *[]*timedReq) error {
	m := d.m
	n := len(r.keys)
	hits := leadingHits(r.out)
	primaryHits := 0
	for _, x := range r.first[:hits] {
		if x == offload.Hit {
			primaryHits++
		}
	}
	promoted := uint64(hits - primaryHits)
	for i := range pool {
		if promoted == 0 {
			break
		}
		c := min(pool[i], promoted)
		d.tierHits[i] += c
		pool[i] -= c
		promoted -= c
	}
	d.res.Requests++
	d.res.Blocks += uint64(n)
	d.res.HitBlocks += uint64(hits)
	d.res.PrimaryHitBlocks += uint64(primaryHits)
	d.res.PromotedHitBlocks += uint64(hits - primaryHits)
	d.res.UnattributedHitBlocks += promoted

	if hits > 0 {
		if _, err := m.PrepareLoad(r.keys[:hits], r.rc); err != nil {
			return fmt.Errorf("workload: request at trace line %d: %w", r.req.Line, err)
		}
		if err := m.CompleteLoad(r.keys[:hits], r.rc); err != nil {
			return fmt.Errorf("workload: request at trace line %d: %w", r.req.Line, err)
		}
	}
	if len(r.leased) > 0 {
		if err := m.CompleteLoad(r.leased, r.rc); err != nil {
			return fmt.Errorf("workload: request at trace line %d: end of lease: %w", r.req.Line, err)
		}
		r.leased = nil
	}
	toStore := r.keys[hits:]
	if r.policy == offload.RequestLevel {
		toStore = r.keys
	}
	if len(toStore) > 0 {
		ps, ok, err := m.PrepareStore(toStore, r.rc)
		if err != nil {
			return fmt.Errorf("workload: request at trace line %d: %w", r.req.Line, err)
		}
		if !ok {
			d.res.StoresRejected++
		} else if len(ps.KeysToStore) > 0 {
			m.Touch(r.keys, r.rc)
			r.stored = ps.KeysToStore
			*storing = append(*storing, r)
			return nil
		}
	}
	m.OnRequestFinished(r.rc)
	return nil
}
