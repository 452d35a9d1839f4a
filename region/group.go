package region

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/tiering"
)

// group is one namespace: its tiers in a tiering.Stack and the state of
// the regions and requests using them. Everything that touches the stack
// runs on the group's executor goroutine (the stack is single-executor);
// callers hand it closures through do.
type group struct {
	name      string
	rowStride int
	svc       *Service
	stack     *tiering.Stack
	cmds      chan func()
	quit      chan struct{}
	done      chan struct{}

	// Executor-owned from here on.
	regions map[*Region]struct{}
	reqs    map[reqKey]*reqState
	// byID maps a stack job id to the engine job it belongs to.
	byID map[uint64]*vjob
	// cur is the engine job whose stack jobs are being submitted, and
	// early the stack jobs that were answered during their submission.
	cur     *vjob
	early   []uint64
	waiters []*lookupWait
	events  []offload.Event // scratch for TakeEvents
	// lookupKeys counts the keys lookups answered, by Found (Unknown: the
	// engine asks again, a step later); promoSteps the engine steps its
	// promotions took, from their submission to their outcome
	// (PromotionStepBuckets), and promoStepSum their sum.
	lookupKeys   [3]uint64
	promoSteps   [len(PromotionStepBuckets) + 1]uint64
	promoStepSum uint64
}

// PromotionStepBuckets are the upper bounds of NamespaceStats's
// histogram of the engine steps a promotion took (the last bucket, past
// them, is implicit).
var PromotionStepBuckets = [...]uint64{0, 1, 2, 3, 5, 8, 13, 21}

type reqKey struct {
	r  *Region
	id string
}

// reqState is what the group remembers of a request: its filters, which
// tier answered Hit for each key (its promotions load from there), and
// its jobs in flight (it is forgotten when finished and idle).
type reqState struct {
	key      reqKey
	ctx      *offload.ReqContext
	hit      map[offload.Key]int
	jobs     int
	finished bool
	last     time.Time
}

// vjob is an engine job: one or several stack jobs (a promotion splits by
// the tier each key hit in; a store fans out to every allowed tier).
type vjob struct {
	r      *Region
	rq     *reqState
	id     uint64
	keys   []offload.Key
	slots  []int64
	promo  bool
	step   uint64 // the region's step count when it was submitted
	total  int    // stack jobs submitted
	done   int    // stack jobs answered
	open   bool   // still submitting
	loaded []offload.Key
	failed int // promotion keys no tier could serve
}

type lookupWait struct {
	r        *Region
	rq       *reqState
	keys     []offload.Key
	found    []Found
	left     []int
	deadline time.Time
	reply    chan<- lookupReply
}

type lookupReply struct {
	found []Found
	err   error
}

func newGroup(svc *Service, name string, rowStride int, tiers []offload.SecondaryTier) (*group, error) {
	g := &group{
		name: name, svc: svc, rowStride: rowStride,
		cmds: make(chan func(), 64), quit: make(chan struct{}), done: make(chan struct{}),
		regions: make(map[*Region]struct{}), reqs: make(map[reqKey]*reqState), byID: make(map[uint64]*vjob),
	}
	st, err := tiering.NewStack(tiering.StackConfig{
		Tiers: tiers, Driver: (*driver)(g), Logger: svc.cfg.Logger.With("namespace", name),
		Admission: svc.cfg.Admission,
	})
	if err != nil {
		for _, t := range tiers {
			t.Close(context.Background())
		}
		return nil, fmt.Errorf("region: namespace %s: %w", name, err)
	}
	g.stack = st
	go g.run()
	return g, nil
}

// do runs f on the executor, waiting for it to be taken (not for it to
// finish).
func (g *group) do(ctx context.Context, f func()) error {
	select {
	case g.cmds <- f:
		return nil
	case <-g.done:
		return fmt.Errorf("%w: namespace %s", ErrClosed, g.name)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// run is the executor: it runs commands, and while work is pending it
// polls the tiers every Tick (their results, their step end — which
// flushes asynchronous lookups — and their events).
func (g *group) run() {
	defer close(g.done)
	t := time.NewTicker(g.svc.cfg.Tick)
	defer t.Stop()
	sweep := time.NewTicker(max(g.svc.cfg.RequestIdle/4, time.Second))
	defer sweep.Stop()
	for {
		var tick <-chan time.Time
		if g.busy() {
			tick = t.C
		}
		select {
		case f := <-g.cmds:
			f()
		case <-tick:
			g.poll()
		case now := <-sweep.C:
			g.expire(now)
		case <-g.quit:
			return
		}
	}
}

func (g *group) busy() bool {
	return len(g.waiters) > 0 || g.stack.HasPendingWork()
}

// poll applies the tiers' results, ends their step, hands their events to
// every region of the namespace and retries the lookups waiting on
// asynchronous tiers.
func (g *group) poll() {
	g.stack.Poll()
	g.stack.ScheduleEnd(offload.ScheduleEnd{})
	if g.events = g.stack.TakeEvents(g.events[:0]); len(g.events) > 0 {
		for r := range g.regions {
			r.pushEvents(g.events)
		}
		clear(g.events)
	}
	if len(g.waiters) == 0 {
		return
	}
	now := time.Now()
	kept := g.waiters[:0]
	for _, w := range g.waiters {
		left := w.left[:0]
		for _, i := range w.left {
			switch res, idx := g.stack.Lookup(w.keys[i], w.rq.ctx); res {
			case offload.Hit:
				w.found[i] = Hit
				w.rq.hit[w.keys[i]] = idx
			case offload.Miss:
				w.found[i] = Miss
			default:
				left = append(left, i)
			}
		}
		w.left = left
		if len(left) == 0 || now.After(w.deadline) {
			g.answer(w) // the rest stay Unknown
			continue
		}
		kept = append(kept, w)
	}
	clear(g.waiters[len(kept):])
	g.waiters = kept
}

// req returns the state of request id of r, creating it from params.
func (g *group) req(r *Region, id string, params []byte) (*reqState, error) {
	k := reqKey{r, id}
	if rq := g.reqs[k]; rq != nil {
		rq.last = time.Now()
		return rq, nil
	}
	if r.reqs >= g.svc.cfg.MaxRequests {
		return nil, fmt.Errorf("%w: region %s has state for %d requests", ErrLimit, r.id, r.reqs)
	}
	ctx, err := g.svc.cfg.Parse(r.id+"/"+id, params)
	if err != nil {
		return nil, err
	}
	rq := &reqState{key: k, ctx: ctx, hit: make(map[offload.Key]int), last: time.Now()}
	g.reqs[k] = rq
	r.reqs++
	g.stack.OnNewRequest(ctx)
	return rq, nil
}

// forget drops request rq from the table and tells the tiers it finished.
func (g *group) forget(rq *reqState) {
	if g.reqs[rq.key] == rq {
		delete(g.reqs, rq.key)
		rq.key.r.reqs--
	}
	g.stack.OnRequestFinished(rq.ctx)
}

func (g *group) lookup(r *Region, id string, params []byte, keys []offload.Key, wait time.Duration, reply chan<- lookupReply) {
	rq, err := g.req(r, id, params)
	if err != nil {
		reply <- lookupReply{err: err}
		return
	}
	// A lookup is a poll point, as in the manager: results that arrived
	// free what they held before the tiers are asked.
	g.stack.Poll()
	w := &lookupWait{r: r, rq: rq, keys: keys, found: make([]Found, len(keys)), deadline: time.Now().Add(cmp.Or(wait, g.svc.cfg.LookupWait)), reply: reply}
	for i, k := range keys {
		switch res, idx := g.stack.Lookup(k, rq.ctx); res {
		case offload.Hit:
			w.found[i] = Hit
			rq.hit[k] = idx
		case offload.Miss:
			w.found[i] = Miss
		default:
			w.left = append(w.left, i)
		}
	}
	if len(w.left) == 0 {
		g.answer(w)
		return
	}
	// The asynchronous tiers check at their step end: end one now.
	g.stack.ScheduleEnd(offload.ScheduleEnd{})
	g.waiters = append(g.waiters, w)
}

func (g *group) submit(r *Region, jobs []Job, params [][]byte) error {
	if r.jobIDs == nil {
		r.jobIDs = make(map[uint64]struct{})
	}
	for i, j := range jobs {
		if _, dup := r.jobIDs[j.ID]; dup {
			return fmt.Errorf("%w: job %d is already in flight", ErrLayout, j.ID)
		}
		for _, prev := range jobs[:i] {
			if prev.ID == j.ID {
				return fmt.Errorf("%w: job %d appears twice", ErrLayout, j.ID)
			}
		}
	}
	var errs []error
	for i, j := range jobs {
		var p []byte
		if i < len(params) {
			p = params[i]
		}
		rq, err := g.req(r, j.RequestID, p)
		if err != nil {
			// The job still gets its one outcome: failed.
			errs = append(errs, fmt.Errorf("job %d: %w", j.ID, err))
			r.push(Result{JobID: j.ID})
			continue
		}
		v := &vjob{r: r, rq: rq, id: j.ID, keys: slices.Clone(j.Keys), slots: slices.Clone(j.Slots), promo: j.Promotion, open: true, step: r.steps.Load()}
		r.jobIDs[j.ID] = struct{}{}
		r.inflight++
		rq.jobs++
		if j.Promotion {
			g.promote(v)
		} else {
			g.cascade(v)
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	return nil
}

// cascade fans a store out to every tier the request's store filter
// allows.
func (g *group) cascade(v *vjob) {
	g.cur, g.early = v, g.early[:0]
	first, n := g.stack.CascadeFrom(v.r.m, v.keys, v.rq.ctx, ^uint64(0))
	g.cur = nil
	g.adopt(v, first, n)
	v.open = false
	g.maybeFinish(v)
}

// adopt records the stack jobs first..first+n-1 of v, except those
// answered during their submission.
func (g *group) adopt(v *vjob, first uint64, n int) {
	v.total += n
	for id := first; id < first+uint64(n); id++ {
		if !slices.Contains(g.early, id) {
			g.byID[id] = v
		}
	}
	g.early = g.early[:0]
}

// promote loads each key from the tier that answered Hit for it (looking
// it up again when the request's lookup did not see it): one stack job
// per tier.
func (g *group) promote(v *vjob) {
	type part struct {
		keys  []offload.Key
		slots []int64
	}
	parts := map[int]*part{}
	var order []int
	for i, k := range v.keys {
		idx, ok := v.rq.hit[k]
		if !ok {
			res, j := g.stack.Lookup(k, v.rq.ctx)
			if res != offload.Hit {
				v.failed++
				continue
			}
			idx = j
		}
		p := parts[idx]
		if p == nil {
			p = &part{}
			parts[idx] = p
			order = append(order, idx)
		}
		p.keys = append(p.keys, k)
		p.slots = append(p.slots, v.slots[i])
	}
	for _, idx := range order {
		p := parts[idx]
		g.cur, g.early = v, g.early[:0]
		id := g.stack.LoadInto(v.r.m, idx, p.keys, p.slots, v.rq.ctx)
		g.cur = nil
		g.adopt(v, id, 1)
	}
	v.open = false
	g.maybeFinish(v)
}

// maybeFinish answers v once all its stack jobs are answered.
func (g *group) maybeFinish(v *vjob) {
	if v.open || v.done < v.total {
		return
	}
	res := Result{JobID: v.id, Success: true}
	if v.promo {
		g.countPromotion(v.r.steps.Load() - v.step)
		if len(v.loaded) < len(v.keys) {
			res.Success = false
			loaded := make(map[offload.Key]struct{}, len(v.loaded))
			for _, k := range v.loaded {
				loaded[k] = struct{}{}
			}
			for i, k := range v.keys {
				if _, ok := loaded[k]; ok {
					res.Loaded = append(res.Loaded, i)
				} else {
					delete(v.rq.hit, k) // a later lookup asks again
				}
			}
		}
	}
	r := v.r
	delete(r.jobIDs, v.id)
	r.inflight--
	r.push(res)
	v.rq.jobs--
	g.maybeForget(v.rq)
	if r.inflight == 0 {
		for _, ch := range r.idleWaiters {
			close(ch)
		}
		r.idleWaiters = nil
		if r.isClosing() {
			g.release(r)
		}
	}
}

func (g *group) maybeForget(rq *reqState) {
	if rq.finished && rq.jobs == 0 {
		g.forget(rq)
	}
}

func (g *group) step(r *Region, finished []string, touches []Touch) {
	for _, t := range touches {
		if rq := g.reqs[reqKey{r, t.RequestID}]; rq != nil {
			g.stack.Touch(t.Keys, rq.ctx)
		}
	}
	for _, id := range finished {
		if rq := g.reqs[reqKey{r, id}]; rq != nil && !rq.finished {
			rq.finished = true
			g.maybeForget(rq)
		}
	}
}

func (g *group) whenIdle(r *Region, ch chan struct{}) {
	if r.inflight == 0 {
		close(ch)
		return
	}
	r.idleWaiters = append(r.idleWaiters, ch)
}

// closing starts closing r: its lookups waiting are answered, its
// requests finish, and once its jobs are answered it is released.
func (g *group) closing(r *Region) {
	kept := g.waiters[:0]
	for _, w := range g.waiters {
		if w.r == r {
			w.reply <- lookupReply{err: fmt.Errorf("%w: region %s", ErrClosed, r.id)}
			continue
		}
		kept = append(kept, w)
	}
	clear(g.waiters[len(kept):])
	g.waiters = kept
	if r.inflight == 0 {
		g.release(r)
	}
}

// release forgets r once none of its jobs is in flight.
func (g *group) release(r *Region) {
	if _, ok := g.regions[r]; !ok {
		return
	}
	delete(g.regions, r)
	for k, rq := range g.reqs {
		if k.r == r {
			g.forget(rq)
		}
	}
	close(r.drained)
}

// expire forgets requests idle for Config.RequestIdle with no job in
// flight.
func (g *group) expire(now time.Time) {
	for _, rq := range g.reqs {
		if rq.jobs == 0 && now.Sub(rq.last) > g.svc.cfg.RequestIdle {
			g.forget(rq)
		}
	}
}

// answer sends a lookup's answer, counted.
func (g *group) answer(w *lookupWait) {
	for _, f := range w.found {
		if int(f) < len(g.lookupKeys) {
			g.lookupKeys[f]++
		}
	}
	w.reply <- lookupReply{found: w.found}
}

// countPromotion counts a promotion that took steps engine steps.
func (g *group) countPromotion(steps uint64) {
	i := 0
	for i < len(PromotionStepBuckets) && steps > PromotionStepBuckets[i] {
		i++
	}
	g.promoSteps[i]++
	g.promoStepSum += steps
}

func (g *group) stats() NamespaceStats {
	st := NamespaceStats{Name: g.name, Regions: len(g.regions), Requests: len(g.reqs), Tiers: g.stack.Stats(), TierObjects: g.stack.Tiers(), RowStride: g.rowStride,
		LookupKeys: g.lookupKeys, PromotionSteps: g.promoSteps[:], PromotionStepSum: g.promoStepSum}
	for r := range g.regions {
		st.Jobs += r.inflight
		r.mu.Lock()
		st.EventsDropped += r.eventsDropped
		r.mu.Unlock()
	}
	return st
}

// close closes the namespace's tiers (answering every job) and stops the
// executor.
func (g *group) close(ctx context.Context) error {
	errc := make(chan error, 1)
	if err := g.do(ctx, func() { errc <- g.stack.Close(ctx) }); err != nil {
		return err
	}
	var err error
	select {
	case err = <-errc:
	case <-ctx.Done():
		err = ctx.Err()
	}
	close(g.quit)
	<-g.done
	return err
}

// driver is the group as the stack's tiering.Driver: the engine already
// holds its cascade sources pinned (vLLM pins them until the job's result)
// and reserved its promotion targets, so pinning is bookkeeping only.
type driver group

func (d *driver) PinCascade(keys []offload.Key) ([]offload.Key, []int64, error) {
	if d.cur == nil {
		return nil, nil, errors.New("region: cascade outside a job")
	}
	return d.cur.keys, d.cur.slots, nil
}

func (d *driver) PinAgain([]int64) error { return nil }

func (d *driver) CascadeDone(j *offload.Job) { (*group)(d).answered(j.ID, nil) }

func (d *driver) PromotionDone(j *offload.Job, loaded []offload.Key) {
	(*group)(d).answered(j.ID, loaded)
}

// answered counts one stack job of an engine job.
func (g *group) answered(id uint64, loaded []offload.Key) {
	v := g.byID[id]
	if v == nil {
		v = g.cur // answered during its submission
		if v == nil {
			return
		}
		g.early = append(g.early, id)
	}
	delete(g.byID, id)
	v.done++
	v.loaded = append(v.loaded, loaded...)
	g.maybeFinish(v)
}

func (r *Region) isClosing() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.closing
}
