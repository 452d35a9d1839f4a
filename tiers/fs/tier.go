package fs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	iofs "io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvtier/kvtier/asynclookup"
	"github.com/kvtier/kvtier/dirlock"
	"github.com/kvtier/kvtier/filemapper"
	"github.com/kvtier/kvtier/offload"
)

// Errors reported in failed job results.
var (
	// ErrClosed fails jobs submitted to, or still queued in, a closed tier.
	ErrClosed = errors.New("fs tier closed")
	// ErrQueueFull refuses a job submitted while its pool's queue is full;
	// the result's error also matches offload.ErrRefused, so a refused
	// cascade counts as dropped, not failed.
	ErrQueueFull = errors.New("fs tier queue full")
	// ErrFull fails a store that cannot fit under max_bytes because the
	// files that could be evicted are all being read.
	ErrFull = errors.New("fs tier full")
	// ErrBadJob reports a malformed job (keys and slots not co-indexed, an
	// invalid key, a slot size that is not the namespace's block size).
	ErrBadJob = errors.New("malformed job")
)

// Tier is the filesystem secondary tier. It implements
// offload.SecondaryTier.
type Tier struct {
	s      settings
	lay    layout
	direct bool

	lookups *asynclookup.Manager

	loadCh  chan *offload.Job
	storeCh chan *offload.Job
	workers sync.WaitGroup
	closing atomic.Bool

	// lock keeps a second kvtier process off the namespace directory.
	lock      *dirlock.Lock
	tmpPrefix string
	tmpSeq    atomic.Uint64
	dirs      *dirCache
	tmp       tmpSweep

	mu        sync.Mutex
	evictCond *sync.Cond // signalled when evictions finish
	idx       index
	reserved  int64 // bytes of stores in progress
	finished  []offload.JobResult
	// queued holds the submission time of each job waiting in a pool's
	// queue; a worker takes its entry when it starts the job, and
	// CancelQueued removes it to withdraw the job.
	queued  map[uint64]time.Time
	pending int           // submitted jobs without a result yet
	idle    chan struct{} // closed when pending drops to 0
	events  []offload.Event
	closed  bool

	st counters

	// Test hooks, nil in production.
	hookAcquired   func(k offload.Key) // a load holds k's reader ref, before open
	hookEvicting   func(k offload.Key) // k is marked evicting, before its unlink
	hookStoreStart func()              // a worker started a store job
}

var (
	_ offload.SecondaryTier = (*Tier)(nil)
	_ offload.JobQueue      = (*Tier)(nil)
)

// New validates cfg, creates the namespace directories, writes
// config.json if absent, probes O_DIRECT, rebuilds the index from the
// files already on disk (removing leftover temp files older than
// stale_tmp_age) and starts the worker pools. An unwritable root_dir, an unknown locality, format or
// o_direct value, or o_direct: on where it is unsupported fail here.
func New(cfg Config) (*Tier, error) {
	s, err := cfg.settings()
	if err != nil {
		return nil, fmt.Errorf("fs tier %q: %w", cfg.Name, err)
	}
	lay, err := newLayout(s.root, s.ns, s.format)
	if err != nil {
		return nil, fmt.Errorf("fs tier %q: %w", s.name, err)
	}
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	t := &Tier{
		s:         s,
		lay:       lay,
		idx:       newIndex(),
		queued:    make(map[uint64]time.Time),
		tmpPrefix: "_" + hex.EncodeToString(rnd[:]),
		dirs:      newDirCache(lay.rankDir),
	}
	sh, err := newShares(cfg.Shares, s.maxBytes)
	if err != nil {
		return nil, fmt.Errorf("fs tier %q: %w", s.name, err)
	}
	t.idx.withShares(sh)
	t.evictCond = sync.NewCond(&t.mu)
	t.lookups = asynclookup.New(s.name, t.exists, asynclookup.Options{MaxBatch: s.lookupBatch, Logger: s.logger})
	for _, step := range []func() error{t.prepareDirs, t.lockDir, t.probeDirect, t.scan} {
		if err := step(); err != nil {
			t.lookups.Close()
			t.lock.Release()
			return nil, fmt.Errorf("fs tier %q: %w", s.name, err)
		}
	}
	t.startTmpSweep()
	if s.format == FormatVLLM {
		s.logger.Warn("fs tier in vLLM's format: block files carry no checksum, so a file swapped for another key's or rewritten in place would be served as is; use format kvtier unless vLLM must read the directory",
			"tier", s.name, "dir", t.lay.rankDir)
	}
	if s.eventsIgnored {
		s.logger.Warn(fmt.Sprintf("events is set on secondary tier '%s' but KV cache events are disabled globally; the tier will not emit events.", s.name))
	}
	t.loadCh = make(chan *offload.Job, s.queueDepth)
	t.storeCh = make(chan *offload.Job, s.queueDepth)
	for range s.readThreads {
		t.workers.Add(1)
		go t.run(t.loadCh, false)
	}
	for range s.writeThreads {
		t.workers.Add(1)
		go t.run(t.storeCh, true)
	}
	return t, nil
}

// lockDir takes the namespace directory's lock before anything reads or
// removes a file of it: a second kvtier process on the same root_dir and
// namespace (another daemon, kvtier fsck --repair) fails here.
func (t *Tier) lockDir() error {
	l, err := dirlock.Acquire(t.lay.base, "fs tier "+t.s.name)
	if err != nil {
		return fmt.Errorf("root_dir %s: %w", t.s.root, err)
	}
	t.lock = l
	return nil
}

// prepareDirs creates the namespace and rank directories and config.json,
// and proves the rank directory writable.
func (t *Tier) prepareDirs() error {
	fs := t.s.fs
	if err := fs.MkdirAll(t.lay.base, 0o700); err != nil {
		return fmt.Errorf("root_dir not writable: %w", err)
	}
	if err := fs.MkdirAll(t.lay.rankDir, 0o700); err != nil {
		return fmt.Errorf("root_dir not writable: %w", err)
	}
	cfgPath := filepath.Join(t.lay.base, filemapper.ConfigFileName)
	if _, err := fs.Stat(cfgPath); errors.Is(err, iofs.ErrNotExist) {
		b, err := t.s.ns.ConfigJSON()
		if err != nil {
			return fmt.Errorf("config.json: %w", err)
		}
		if err := t.writeSmall(cfgPath, b); err != nil {
			return fmt.Errorf("root_dir not writable: config.json: %w", err)
		}
	} else if err != nil {
		return fmt.Errorf("config.json: %w", err)
	}
	probe := filepath.Join(t.lay.rankDir, ".kvtier-probe"+t.tmpPrefix+".tmp")
	if err := t.writeSmall(probe, nil); err != nil {
		return fmt.Errorf("root_dir not writable: %w", err)
	}
	return fs.Remove(probe)
}

// writeSmall writes a small file atomically (temp + rename).
func (t *Tier) writeSmall(name string, data []byte) error {
	tmp := name + t.tmpPrefix + ".tmp"
	f, err := t.s.fs.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	_, werr := f.Write(data)
	cerr := f.Close()
	if err := errors.Join(werr, cerr); err != nil {
		_ = t.s.fs.Remove(tmp)
		return err
	}
	if err := t.s.fs.Rename(tmp, name); err != nil {
		_ = t.s.fs.Remove(tmp)
		return err
	}
	return nil
}

// probeDirect decides whether block I/O uses O_DIRECT: one aligned page
// written with it in the rank directory.
func (t *Tier) probeDirect() error {
	if t.s.direct == directOff {
		return nil
	}
	err := t.tryDirect()
	if err == nil {
		t.direct = true
		return nil
	}
	if t.s.direct == directOn {
		return fmt.Errorf("o_direct: on, but the filesystem rejects it: %w", err)
	}
	t.s.logger.Info("O_DIRECT unavailable, using buffered I/O", "dir", t.lay.rankDir, "err", err)
	return nil
}

func (t *Tier) tryDirect() error {
	if oDirect == 0 {
		return errors.New("O_DIRECT is not supported on this platform")
	}
	name := filepath.Join(t.lay.rankDir, ".odirect-probe"+t.tmpPrefix+".tmp")
	f, err := t.s.fs.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_WRONLY|oDirect, 0o600)
	if err != nil {
		return err
	}
	_, werr := f.WriteAt(alignedBuf(align), 0)
	cerr := f.Close()
	rerr := t.s.fs.Remove(name)
	return errors.Join(werr, cerr, rerr)
}

// Name implements offload.SecondaryTier.
func (t *Tier) Name() string { return t.s.name }

// Type implements offload.SecondaryTier; it is "fs".
func (t *Tier) Type() string { return "fs" }

// Medium implements offload.SecondaryTier; it is STORAGE.
func (t *Tier) Medium() offload.Medium { return offload.MediumStorage }

// Locality implements offload.SecondaryTier; it is the configured one.
func (t *Tier) Locality() offload.Locality { return t.s.locality }

// ClaimsBlocks implements offload.BlockClaimer: a store reads each
// block's slot only while it writes that block.
func (t *Tier) ClaimsBlocks() bool { return true }

// Direct reports whether block I/O uses O_DIRECT.
func (t *Tier) Direct() bool { return t.direct }

// Path returns the file that holds k (vLLM's get_file_name).
func (t *Tier) Path(k offload.Key) string { return t.lay.path(k) }

// ConfigPath returns the path of config.json.
func (t *Tier) ConfigPath() string { return filepath.Join(t.lay.base, filemapper.ConfigFileName) }

// Lookup implements offload.SecondaryTier: Retry until the batched
// existence check of key lands (after an OnScheduleEnd), then Hit or
// Miss.
func (t *Tier) Lookup(key offload.Key, req *offload.ReqContext) offload.LookupResult {
	if !key.Valid() {
		return offload.Miss
	}
	return t.lookups.Lookup(key, reqID(req))
}

func reqID(req *offload.ReqContext) string {
	if req == nil {
		return ""
	}
	return req.ID
}

// Holds sets held[i] for each of keys the tier's index knows as a live
// block it would load (tiering.Holder): no stat, no adoption of files
// other processes wrote, no recency update, no event.
func (t *Tier) Holds(keys []offload.Key, held []bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i, k := range keys {
		if j, ok := t.idx.find(k); ok {
			e := &t.idx.ents[j]
			if e.state == stateLive && !t.foreign(int64(e.size)) {
				held[i] = true
			}
		}
	}
}

// Keys appends the keys of the live blocks the tier's index knows that
// match accepts (tiering.Lister); files other processes wrote and the
// index has not adopted are not listed.
func (t *Tier) Keys(match func(offload.Key) bool, dst []offload.Key) []offload.Key {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i := range t.idx.ents {
		e := &t.idx.ents[i]
		if e.state == stateLive && match(e.key) {
			dst = append(dst, e.key)
		}
	}
	return dst
}

// exists is the asynclookup batch function: the index first, a stat for
// keys it does not know (files another process wrote are adopted).
func (t *Tier) exists(ctx context.Context, keys []offload.Key) ([]bool, error) {
	out := make([]bool, len(keys))
	var unknown []int
	t.mu.Lock()
	for i, k := range keys {
		if j, ok := t.idx.find(k); ok {
			e := &t.idx.ents[j]
			out[i] = e.state == stateLive && !t.foreign(int64(e.size))
		} else {
			unknown = append(unknown, i)
		}
	}
	t.mu.Unlock()
	for _, i := range unknown {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		size, ok := t.adopt(keys[i])
		out[i] = ok && !t.foreign(size)
	}
	return out, nil
}

// foreign reports a file of size bytes that a load would refuse without
// deleting it: in kvtier's format a raw vLLM block (no trailer); in
// vLLM's, a file of another size (another block size shares vLLM's
// directory, or the file is short). Lookups answer Miss for it rather
// than promise a block that every load fails on. In kvtier's format other
// wrong sizes stay hits: their load deletes them as corrupt (the
// directory names the block size, so no other tier wrote them), after
// which a store can write the block.
func (t *Tier) foreign(size int64) bool {
	bb := int64(t.s.ns.BlockBytes)
	if bb <= 0 {
		return false
	}
	if t.s.format == FormatVLLM {
		return size != bb
	}
	return size == bb
}

// adopt indexes k's file if it exists on disk but not in the index; it
// returns the file's size and whether it is live.
func (t *Tier) adopt(k offload.Key) (int64, bool) {
	fi, err := t.s.fs.Stat(t.lay.path(k))
	if err != nil || !fi.Mode().IsRegular() || fi.Size() > int64(^uint32(0)) {
		return 0, false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if i, ok := t.idx.find(k); ok {
		e := &t.idx.ents[i]
		return int64(e.size), e.state == stateLive
	}
	t.idx.insert(k, fi.Size())
	return fi.Size(), true
}

// SubmitStore implements offload.SecondaryTier.
func (t *Tier) SubmitStore(job *offload.Job) { t.submit(job, t.storeCh, true) }

// SubmitLoad implements offload.SecondaryTier.
func (t *Tier) SubmitLoad(job *offload.Job) { t.submit(job, t.loadCh, false) }

func (t *Tier) submit(job *offload.Job, ch chan *offload.Job, store bool) {
	now := time.Now()
	t.mu.Lock()
	t.pending++
	if t.pending == 1 {
		t.idle = make(chan struct{})
	}
	if t.closed {
		t.mu.Unlock()
		t.fail(job, store, nil, ErrClosed, now)
		return
	}
	if _, dup := t.queued[job.ID]; dup {
		t.mu.Unlock()
		t.fail(job, store, nil, fmt.Errorf("%w: job id %d is already queued", ErrBadJob, job.ID), now)
		return
	}
	select {
	case ch <- job:
		t.queued[job.ID] = now
		t.mu.Unlock()
	default:
		t.mu.Unlock()
		t.st.queueFull.Add(1)
		t.fail(job, store, nil, offload.Refused(offload.RefusedQueueFull, ErrQueueFull), now)
	}
}

// start takes a queued job for a worker and returns its submission time;
// false means the job was withdrawn (CancelQueued) and must be skipped.
func (t *Tier) start(job *offload.Job) (time.Time, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	at, ok := t.queued[job.ID]
	if ok {
		delete(t.queued, job.ID)
	}
	return at, ok
}

// QueuedJobs implements offload.JobQueue: jobs waiting for a worker, and
// the capacity of the two pools' queues.
func (t *Tier) QueuedJobs() (queued, capacity int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.queued), 2 * t.s.queueDepth
}

// CancelQueued implements offload.JobQueue: a job no worker has started is
// withdrawn and will never be answered; its slot in the queue's channel
// is skipped when a worker reaches it.
func (t *Tier) CancelQueued(id uint64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.queued[id]; !ok {
		return false
	}
	delete(t.queued, id)
	t.st.cancelled.Add(1)
	t.donePendingLocked()
	return true
}

// finish records a job's result exactly once.
func (t *Tier) finish(r offload.JobResult) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.finished = append(t.finished, r)
	t.donePendingLocked()
}

// donePendingLocked counts one submitted job as answered (or withdrawn);
// t.mu is held.
func (t *Tier) donePendingLocked() {
	t.pending--
	if t.pending == 0 {
		close(t.idle)
	}
}

// fail answers job with a failure.
func (t *Tier) fail(job *offload.Job, store bool, ok []offload.Key, err error, start time.Time) {
	if store {
		t.st.storeFailed.Add(1)
	} else {
		t.st.loadFailed.Add(1)
	}
	t.finish(offload.JobResult{JobID: job.ID, SuccessfulKeys: ok, Duration: time.Since(start), Err: err})
}

// FinishedJobs implements offload.SecondaryTier.
func (t *Tier) FinishedJobs() []offload.JobResult {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.finished) == 0 {
		return nil
	}
	out := t.finished
	t.finished = nil
	return out
}

// DrainJobs implements offload.SecondaryTier: it waits until every
// submitted job has a result.
func (t *Tier) DrainJobs(ctx context.Context) error {
	t.mu.Lock()
	if t.pending == 0 {
		t.mu.Unlock()
		return nil
	}
	idle := t.idle
	t.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("fs tier %q: drain: %w", t.s.name, ctx.Err())
	}
}

// HasPendingWork implements offload.SecondaryTier: jobs without a
// collected result, or existence checks queued or in flight.
func (t *Tier) HasPendingWork() bool {
	t.mu.Lock()
	busy := t.pending > 0 || len(t.finished) > 0
	t.mu.Unlock()
	return busy || t.lookups.Pending()
}

// Touch implements offload.SecondaryTier: the files of keys become most
// recently used.
func (t *Tier) Touch(keys []offload.Key, _ *offload.ReqContext) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, k := range keys {
		if i, ok := t.idx.find(k); ok {
			t.idx.touch(i)
		}
	}
}

// OnNewRequest implements offload.SecondaryTier; the tier stores at block
// level.
func (t *Tier) OnNewRequest(*offload.ReqContext) offload.OffloadPolicy { return offload.BlockLevel }

// OnRequestFinished implements offload.SecondaryTier: the request's lookup
// state goes.
func (t *Tier) OnRequestFinished(req *offload.ReqContext) { t.lookups.Cleanup(reqID(req)) }

// OnScheduleEnd implements offload.SecondaryTier: the step's existence
// checks are flushed as one batch.
func (t *Tier) OnScheduleEnd(offload.ScheduleEnd) { t.lookups.Flush() }

// TakeEvents implements offload.SecondaryTier.
func (t *Tier) TakeEvents() []offload.Event {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.events) == 0 {
		return nil
	}
	out := t.events
	t.events = nil
	return out
}

// emitLocked buffers an event when events are on; t.mu is held.
func (t *Tier) emitLocked(keys []offload.Key, removed bool) {
	if !t.s.events || len(keys) == 0 {
		return
	}
	t.events = append(t.events, offload.Event{
		Keys: slices.Clone(keys), Medium: offload.MediumStorage,
		Locality: t.s.locality, Removed: removed, Tier: t.s.name,
	})
}

// Close implements offload.SecondaryTier. Jobs still queued fail with
// ErrClosed, a batched job in progress stops after its current block
// (loads report the loaded prefix), and Close waits for the workers; if
// ctx ends first it returns ctx's error while they finish. Results stay
// available through FinishedJobs.
func (t *Tier) Close(ctx context.Context) error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	t.closing.Store(true)
	close(t.loadCh)
	close(t.storeCh)
	t.mu.Unlock()
	t.lookups.Close()
	t.stopTmpSweep()
	done := make(chan struct{})
	go func() { t.workers.Wait(); t.lock.Release(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("fs tier %q: close: %w", t.s.name, ctx.Err())
	}
}

// run is one pool worker.
func (t *Tier) run(ch chan *offload.Job, store bool) {
	defer t.workers.Done()
	w := &worker{t: t}
	for job := range ch {
		at, ok := t.start(job)
		if !ok {
			continue // withdrawn
		}
		if t.closing.Load() {
			t.fail(job, store, nil, ErrClosed, at)
			continue
		}
		if store {
			w.store(job, at)
		} else {
			w.load(job, at)
		}
	}
}
