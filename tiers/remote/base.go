package remote

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/kvtier/kvtier/asynclookup"
	"github.com/kvtier/kvtier/offload"
)

// StoreFunc writes the blocks of a store job that has keys and an arena
// and returns the first error. It reads a block's slot only between
// job.Claim(i) and job.Release(i) (Base declares offload.BlockClaimer),
// skips the blocks whose claim fails (the manager took them back) and
// may refuse blocks whose server is down (one node of a cluster) without
// any I/O; fates[i] says which (nil when every block was written). It
// counts the blocks and bytes it wrote; Base counts the job and emits its
// event.
type StoreFunc func(ctx context.Context, job *offload.Job) (fates []Fate, err error)

// Fate is what became of one block of a successful store job.
type Fate uint8

const (
	// Written: the server holds the block.
	Written Fate = iota
	// TakenBack: the manager took the block back before it was read.
	TakenBack
	// NodeDown: not sent, because the server that holds its key (a
	// cluster node) is down; reported to the manager as a tier_down drop.
	NodeDown
)

// LoadFunc reads the blocks of a load job into slots, verifying each: for
// every i with slots[i] != nil it sets errs[i] (nil when block i is in
// its slot). Entries with a nil slot already hold why they cannot load.
type LoadFunc func(ctx context.Context, job *offload.Job, slots [][]byte, errs []error)

// BaseConfig configures a Base. The tier builds its Health, Counters and
// Events (it uses them itself) and hands them over.
type BaseConfig struct {
	// Name is the configured tier name; Label prefixes errors and log
	// lines (`s3 tier "objects"`).
	Name, Label string
	Medium      offload.Medium
	Locality    offload.Locality

	// Health gates lookups and submissions; Close closes it.
	Health *Health
	// Counters receive the lookup and job counts; the tier counts its
	// own I/O in them.
	Counters *Counters
	// Events receives a stored event per successful store job; nil when
	// the tier's events are off.
	Events *Events

	// MaxInflight bounds jobs in flight; beyond it a job fails at once.
	MaxInflight int
	// Exists checks existence for lookups, batched per step: at most
	// LookupBatch keys and LookupTimeout per call (asynclookup.Options).
	Exists        asynclookup.BatchFunc
	LookupBatch   int
	LookupTimeout time.Duration
	Logger        *slog.Logger

	Store StoreFunc
	Load  LoadFunc

	// Budget, when set, is the tier's max_bytes: a store job is admitted
	// by it and first deletes its victims with Delete (see Budget).
	Budget *Budget
	Delete DeleteFunc
}

// DeleteFunc deletes keys on the server and returns those it could not
// delete, with the first error; deleting a key the server does not hold
// is not an error.
type DeleteFunc func(ctx context.Context, keys []offload.Key) (failed []offload.Key, err error)

// Base is the backend-independent part of a remote secondary tier: its
// declarations, the health gate in front of every lookup and job, the
// job table, the asynchronous existence checks and the queues that carry
// job outcomes back to them, and the job and lookup counters. A tier
// embeds a *Base, which implements every offload.SecondaryTier method
// but Type and Touch, and supplies the I/O: the existence check and the
// StoreFunc and LoadFunc. A tier that holds more than Base (connections,
// goroutines) defines its own Close, which calls Base's first.
//
// All methods are safe for concurrent use; the SecondaryTier methods are
// called from the manager's goroutine and never block on I/O.
type Base struct {
	name, label string
	medium      offload.Medium
	locality    offload.Locality

	health  *Health
	c       *Counters
	events  *Events
	jobs    *JobTable
	lookups *asynclookup.Manager
	store   StoreFunc
	load    LoadFunc
	budget  *Budget
	del     DeleteFunc

	// missQ and forgetQ carry keys from job goroutines to the lookup
	// state, applied on the manager's goroutine.
	missQ, forgetQ keyQueue
}

// NewBase starts the job table and the existence-check worker of cfg.
func NewBase(cfg BaseConfig) *Base {
	return &Base{
		name:     cfg.Name,
		label:    cfg.Label,
		medium:   cfg.Medium,
		locality: cfg.Locality,
		health:   cfg.Health,
		c:        cfg.Counters,
		events:   cfg.Events,
		jobs:     NewJobTable(cfg.Label, cfg.MaxInflight),
		lookups: asynclookup.New(cfg.Label, cfg.Exists, asynclookup.Options{
			MaxBatch: cfg.LookupBatch,
			Timeout:  cfg.LookupTimeout,
			Logger:   cfg.Logger,
		}),
		store:  cfg.Store,
		load:   cfg.Load,
		budget: cfg.Budget,
		del:    cfg.Delete,
	}
}

// Name returns the configured tier name.
func (b *Base) Name() string { return b.name }

// Medium returns the medium the tier declares.
func (b *Base) Medium() offload.Medium { return b.medium }

// Locality returns the configured locality.
func (b *Base) Locality() offload.Locality { return b.locality }

// ClaimsBlocks implements offload.BlockClaimer: the StoreFunc reads a
// block's slot only while it claims it.
func (b *Base) ClaimsBlocks() bool { return true }

// Healthy reports whether the server is considered up.
func (b *Base) Healthy() bool { return b.health.Healthy() }

// Stats returns the tier's counters and gauges.
func (b *Base) Stats() Stats {
	s := b.c.Snapshot()
	s.Healthy = b.health.Healthy()
	s.Downs = b.health.Downs()
	s.InFlightJobs = b.jobs.Active()
	s.EventsDropped = b.events.Dropped()
	return s
}

// Lookup answers from the batched existence checks: Retry until the
// check of key has run, then Hit or Miss. While the server is down it
// answers Miss without queueing anything.
func (b *Base) Lookup(key offload.Key, req *offload.ReqContext) offload.LookupResult {
	b.c.Lookups.Add(1)
	if !b.health.Healthy() {
		b.c.LookupsUnhealthy.Add(1)
		return offload.Miss
	}
	return b.lookups.Lookup(key, reqID(req))
}

func reqID(req *offload.ReqContext) string {
	if req == nil {
		return ""
	}
	return req.ID
}

// SubmitStore starts the job's StoreFunc. While the server is down the
// job fails at once (a skipped cascade), as it does when the tier is
// closed or has its maximum of jobs in flight.
func (b *Base) SubmitStore(job *offload.Job) {
	if !b.health.Healthy() {
		b.c.StoreJobsSkipped.Add(1)
		b.jobs.Fail(job, offload.Refused(offload.RefusedTierDown, fmt.Errorf("%s: store job %d: %w", b.label, job.ID, ErrUnavailable)))
		return
	}
	if !b.jobs.Submit(job, b.runStore) {
		b.c.StoreJobsSkipped.Add(1)
	}
}

// SubmitLoad starts the job's LoadFunc. A job refused at once (server
// down, tier closed or full) fails, and its keys answer Miss for the
// request so that the manager does not promote them again in a loop.
func (b *Base) SubmitLoad(job *offload.Job) {
	if !b.health.Healthy() {
		b.c.LoadJobsSkipped.Add(1)
		b.lookups.MarkMiss(job.Keys)
		b.jobs.Fail(job, offload.Refused(offload.RefusedTierDown, fmt.Errorf("%s: load job %d: %w", b.label, job.ID, ErrUnavailable)))
		return
	}
	if !b.jobs.Submit(job, b.runLoad) {
		b.c.LoadJobsSkipped.Add(1)
		b.lookups.MarkMiss(job.Keys)
	}
}

// runStore answers a store job: empty jobs succeed, a job without an
// arena fails, the rest go to the StoreFunc. A stored job's keys drop
// their cached verdicts (they may have been misses) and are reported in
// a stored event.
func (b *Base) runStore(ctx context.Context, job *offload.Job) offload.JobResult {
	start := time.Now()
	var err error
	var fates []Fate
	switch {
	case len(job.Keys) == 0:
	case job.Arena == nil:
		err = fmt.Errorf("%s: store job %d: no arena", b.label, job.ID)
	case b.budget != nil:
		fates, err = b.storeWithin(ctx, job)
	default:
		fates, err = b.callStore(ctx, job)
	}
	res := offload.JobResult{Duration: time.Since(start)}
	if err != nil {
		b.c.StoreJobsFailed.Add(1)
		res.Err = err
		return res
	}
	stored := job.Keys
	if fates != nil {
		stored = make([]offload.Key, 0, len(job.Keys))
		for i, k := range job.Keys {
			switch fates[i] {
			case Written:
				stored = append(stored, k)
			case NodeDown:
				res.Refused++
			}
		}
	}
	if res.Refused > 0 {
		b.c.BlocksNodeDown.Add(int64(res.Refused))
		if res.Refused == len(job.Keys) {
			// Nothing was sent: the job was refused, as a whole tier down
			// would have refused it.
			b.c.StoreJobsSkipped.Add(1)
			res.Refused = 0
			res.Err = offload.Refused(offload.RefusedTierDown, fmt.Errorf("%s: store job %d: every block's node is down: %w", b.label, job.ID, ErrUnavailable))
			return res
		}
	}
	b.c.StoreJobsOK.Add(1)
	res.Success = true
	if len(stored) > 0 {
		res.Bytes = int64(len(stored)) * int64(job.Arena.SlotSize())
		b.forgetQ.Add(stored...)
		b.events.Stored(stored)
	}
	return res
}

// storeWithin runs a store job under the tier's Budget: admitted, its
// victims deleted (and announced removed), written, settled.
func (b *Base) storeWithin(ctx context.Context, job *offload.Job) ([]Fate, error) {
	size := int64(HeaderSize + job.Arena.SlotSize())
	adm, victims, err := b.budget.Admit(job.Keys, size)
	if err != nil {
		return nil, fmt.Errorf("%s: store job %d: %d blocks: %w", b.label, job.ID, len(job.Keys), err)
	}
	if len(victims) > 0 {
		failed, err := b.del(ctx, victims)
		if len(failed) < len(victims) {
			gone := victims
			if len(failed) > 0 {
				gone = slices.DeleteFunc(slices.Clone(victims), func(k offload.Key) bool { return slices.Contains(failed, k) })
			}
			b.forgetQ.Add(gone...)
			b.events.Removed(gone)
		}
		if len(failed) > 0 || err != nil {
			// The server may still hold them: counted again, as the
			// newest (a node that is down must not make every store pick
			// them again), and the job's blocks are not written.
			b.budget.Restore(failed, size)
			b.budget.Settle(adm, func(int) bool { return false })
			return nil, fmt.Errorf("%s: store job %d: deleting %d of %d blocks to make room: %w", b.label, job.ID, len(failed), len(victims), err)
		}
	}
	fates, err := b.callStore(ctx, job)
	b.budget.Settle(adm, func(i int) bool {
		// After a failure any block may have reached the server.
		return err != nil || fates == nil || fates[i] == Written
	})
	return fates, err
}

// runLoad answers a load job: the slots are resolved (a key without a
// usable slot fails alone), the LoadFunc fills the rest, and a partial
// load reports its loaded prefix. Failed keys answer Miss for the
// requests that reference them.
func (b *Base) runLoad(ctx context.Context, job *offload.Job) offload.JobResult {
	start := time.Now()
	slots, errs, usable := b.slots(job)
	if usable {
		b.callLoad(ctx, job, slots, errs)
	}
	loaded, err := loadedKeys(job.Keys, errs)
	if b.budget != nil {
		b.settleLoad(job.Keys, loaded, errs)
	}
	res := offload.JobResult{Duration: time.Since(start)}
	if len(loaded) > 0 {
		res.Bytes = int64(len(loaded)) * int64(job.Arena.SlotSize())
	}
	if err == nil {
		b.c.LoadJobsOK.Add(1)
		res.Success = true
		return res
	}
	b.c.LoadJobsFailed.Add(1)
	res.Err = err
	res.SuccessfulKeys = loaded
	var failed []offload.Key
	for i, e := range errs {
		if e != nil {
			failed = append(failed, job.Keys[i])
		}
	}
	b.missQ.Add(failed...)
	return res
}

// settleLoad tells the Budget which blocks were read (the newest now)
// and which the server no longer holds.
func (b *Base) settleLoad(keys, loaded []offload.Key, errs []error) {
	if len(loaded) == len(keys) {
		b.budget.Touch(keys)
		return
	}
	b.budget.Touch(loaded)
	var gone []offload.Key
	for i, e := range errs {
		if errors.Is(e, ErrNotFound) {
			gone = append(gone, keys[i])
		}
	}
	b.budget.Forget(gone)
}

// callStore and callLoad run the tier's I/O, turning a panic into the
// job's failure so that it is counted, and a load's keys marked Miss,
// like any other failure (the job table alone would only answer the job,
// and the manager would promote the keys again and again).
func (b *Base) callStore(ctx context.Context, job *offload.Job) (fates []Fate, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%s: store job %d: panic: %v", b.label, job.ID, p)
		}
	}()
	return b.store(ctx, job)
}

func (b *Base) callLoad(ctx context.Context, job *offload.Job, slots [][]byte, errs []error) {
	defer func() {
		if p := recover(); p != nil {
			err := fmt.Errorf("%s: load job %d: panic: %v", b.label, job.ID, p)
			for i := range errs {
				if slots[i] != nil { // whatever it wrote is not to be trusted
					errs[i] = err
				}
			}
		}
	}()
	b.load(ctx, job, slots, errs)
}

// slots returns the destination slot of every key of a load job, or in
// errs why it has none; usable reports whether any key has one.
func (b *Base) slots(job *offload.Job) (slots [][]byte, errs []error, usable bool) {
	n := len(job.Keys)
	slots, errs = make([][]byte, n), make([]error, n)
	for i, k := range job.Keys {
		switch {
		case job.Arena == nil:
			errs[i] = fmt.Errorf("%s: load job %d: no arena", b.label, job.ID)
		case i >= len(job.Slots):
			errs[i] = fmt.Errorf("%s: load %s: job has %d slots for %d keys", b.label, k, len(job.Slots), n)
		case !k.Valid():
			errs[i] = fmt.Errorf("%s: load: %w", b.label, offload.ErrInvalidKey)
		default:
			s, err := job.Arena.Slot(job.Slots[i])
			if err != nil {
				errs[i] = fmt.Errorf("%s: load %s: %w", b.label, k, err)
				continue
			}
			slots[i] = s
			usable = true
		}
	}
	return slots, errs, usable
}

// Delete removes keys' blocks from the server on request (a router's or
// an agent's delete; tiering.Deleter): the keys the server did not fail
// leave the lookup state and the ledger of max_bytes, and those the tier
// had announced stored are announced removed. It returns how many keys the
// tier no longer holds (a key it never held counts: a server cannot say
// cheaply whether an object existed); the error joins the failures.
func (b *Base) Delete(ctx context.Context, keys []offload.Key) (int, error) {
	if len(keys) == 0 || b.del == nil {
		return 0, nil
	}
	failed, err := b.del(ctx, keys)
	gone := keys
	if len(failed) > 0 {
		bad := make(map[offload.Key]bool, len(failed))
		for _, k := range failed {
			bad[k] = true
		}
		gone = make([]offload.Key, 0, len(keys)-len(failed))
		for _, k := range keys {
			if !bad[k] {
				gone = append(gone, k)
			}
		}
	}
	b.Invalidate(gone...)
	if b.budget != nil {
		b.budget.Forget(gone)
	}
	b.events.Removed(gone)
	if err != nil {
		err = fmt.Errorf("%s tier %q: delete: %w", b.label, b.name, err)
	}
	return len(gone), err
}

// Invalidate queues keys whose cached lookup verdicts must go (the server
// removed them); it may be called from any goroutine and takes effect at
// the next FinishedJobs or OnScheduleEnd.
func (b *Base) Invalidate(keys ...offload.Key) { b.forgetQ.Add(keys...) }

// FinishedJobs returns the results available since the previous call.
func (b *Base) FinishedJobs() []offload.JobResult {
	res := b.jobs.Take()
	// Taken after the results: every result above queued its keys first.
	b.applyQueues()
	return res
}

func (b *Base) applyQueues() {
	if keys := b.missQ.Take(); len(keys) > 0 {
		b.lookups.MarkMiss(keys)
	}
	if keys := b.forgetQ.Take(); len(keys) > 0 {
		b.lookups.Forget(keys)
	}
}

// DrainJobs waits until every submitted job has a result.
func (b *Base) DrainJobs(ctx context.Context) error { return b.jobs.Drain(ctx) }

// HasPendingWork reports jobs in flight, results not yet taken, or
// existence checks queued or in flight.
func (b *Base) HasPendingWork() bool { return b.jobs.Pending() || b.lookups.Pending() }

// OnNewRequest answers BlockLevel.
func (b *Base) OnNewRequest(*offload.ReqContext) offload.OffloadPolicy { return offload.BlockLevel }

// OnRequestFinished drops the request's lookup state.
func (b *Base) OnRequestFinished(req *offload.ReqContext) { b.lookups.Cleanup(reqID(req)) }

// OnScheduleEnd applies the outcomes of finished jobs and sends this
// step's existence checks as one batch.
func (b *Base) OnScheduleEnd(offload.ScheduleEnd) {
	b.applyQueues()
	b.lookups.Flush()
}

// TakeEvents returns the events since the previous call, in the order
// they happened (none when events are off).
func (b *Base) TakeEvents() []offload.Event { return b.events.Take() }

// Close cancels running jobs, waits for them until ctx ends, answers
// every outstanding job, and stops the existence checks and health
// probes. The tier's Close calls it before releasing its connections.
// It is idempotent.
func (b *Base) Close(ctx context.Context) error {
	err := b.jobs.Close(ctx)
	b.lookups.Close()
	b.health.Close()
	return err
}
