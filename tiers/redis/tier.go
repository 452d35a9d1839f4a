package redis

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/kvtier/kvtier/asynclookup"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/tiers/remote"
)

// Type is the configured type name of the tier.
const Type = "redis"

// ErrUnreachable reports a server that did not answer at startup.
var ErrUnreachable = errors.New("server unreachable")

// ErrNotFound reports a block the server does not hold (never stored,
// evicted or expired).
var ErrNotFound = errors.New("block not found")

// ErrValueTooLarge reports a block whose envelope exceeds max_value_bytes.
var ErrValueTooLarge = errors.New("value exceeds max_value_bytes")

// deleteIfUnchanged deletes KEYS[1] only if it still holds ARGV[1]: a
// corrupt value is removed, but a good value written since the read is
// not.
var deleteIfUnchanged = goredis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
	return redis.call('DEL', KEYS[1])
end
return 0`)

// Tier is a Redis or Valkey server as a (usually remote) CPU secondary
// tier. It implements offload.SecondaryTier.
type Tier struct {
	cfg      Config
	name     string
	locality offload.Locality
	log      *slog.Logger

	client *goredis.Client
	health *remote.Health
	retry  *remote.Retrier // transfers
	// probeRetry runs existence checks with the shorter lookup timeout.
	probeRetry *remote.Retrier
	jobs       *remote.Jobs
	lookups    *asynclookup.Manager
	ioSem      chan struct{} // bounds concurrent transfer pipelines

	events         *remote.Events // nil when events are off
	missQ, forgetQ remote.KeyQueue
	c              remote.Counters
	serverRemoved  atomic.Int64
	// notify is set while the server is known to publish the key events
	// the tier subscribed to; the tier then leaves removed events for its
	// own deletions to the subscription.
	notify atomic.Bool

	touches chan []offload.Key

	ctx    context.Context // canceled by Close; background goroutines
	cancel context.CancelFunc
	wg     sync.WaitGroup

	closeOnce sync.Once
	closeErr  error
}

var _ offload.SecondaryTier = (*Tier)(nil)

// New validates cfg, connects and pings the server: an unreachable server
// or failed authentication is an error naming the address. ctx bounds the
// startup checks.
func New(ctx context.Context, cfg Config) (*Tier, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	loc, _ := parseLocality(cfg.Locality)
	t := &Tier{
		cfg:      cfg,
		name:     cfg.Name,
		locality: loc,
		log:      cfg.Logger,
		ioSem:    make(chan struct{}, cfg.PoolSize),
		touches:  make(chan []offload.Key, 64),
	}
	if t.log == nil {
		t.log = slog.Default()
	}
	t.log = t.log.With("tier", cfg.Name, "type", Type)
	if cfg.Events {
		t.events = remote.NewEvents(0)
	}
	t.client = goredis.NewClient(&goredis.Options{
		Addr:                  cfg.Addr,
		Username:              cfg.Username,
		Password:              cfg.Password,
		DB:                    cfg.DB,
		PoolSize:              cfg.PoolSize,
		DialTimeout:           cfg.DialTimeout,
		DialerRetries:         1,
		ReadTimeout:           cfg.Timeout,
		WriteTimeout:          cfg.Timeout,
		PoolTimeout:           cfg.Timeout,
		ContextTimeoutEnabled: true,
		// The tier retries itself so that it stops as soon as the server
		// is marked down.
		MaxRetries:               -1,
		DisableIdentity:          true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})

	pctx, cancel := context.WithTimeout(ctx, cfg.DialTimeout+cfg.Timeout)
	err := t.client.Ping(pctx).Err()
	cancel()
	if err != nil {
		t.client.Close()
		var re goredis.Error
		if errors.As(err, &re) {
			return nil, fmt.Errorf("%s: %s: %w", t.label(), cfg.Addr, err)
		}
		return nil, fmt.Errorf("%s: %s: %w: %w", t.label(), cfg.Addr, ErrUnreachable, err)
	}

	t.ctx, t.cancel = context.WithCancel(context.Background())
	t.health = remote.NewHealth(t.label(), t.probe, remote.HealthOptions{
		Threshold: cfg.UnhealthyAfter,
		Interval:  cfg.ProbeInterval,
		Timeout:   cfg.DialTimeout + cfg.Timeout,
		Logger:    t.log,
		OnRecover: func(ctx context.Context) {
			// A restarted server forgot CONFIG SET; enable again.
			if cfg.KeyspaceEvents {
				t.enableNotifications(ctx)
			}
		},
	})
	t.retry = &remote.Retrier{Timeout: cfg.Timeout, Backoff: cfg.RetryBackoff, Health: t.health, Counters: &t.c, Classify: classify}
	t.probeRetry = &remote.Retrier{Timeout: cfg.LookupTimeout, Backoff: cfg.RetryBackoff, Health: t.health, Counters: &t.c, Classify: classify}
	t.jobs = remote.NewJobs(t.label(), cfg.MaxInflight)
	t.lookups = asynclookup.New(t.label(), t.exists, asynclookup.Options{
		MaxBatch: cfg.LookupBatch,
		Timeout:  cfg.LookupTimeout,
		Logger:   t.log,
	})
	if cfg.KeyspaceEvents {
		t.enableNotifications(ctx)
		t.startSubscriber()
	}
	t.wg.Add(1)
	go t.touchLoop()
	return t, nil
}

func (t *Tier) label() string { return fmt.Sprintf("redis tier %q", t.name) }

func (t *Tier) probe(ctx context.Context) error { return t.client.Ping(ctx).Err() }

// classify: a server error reply shows a working server unless it says
// the server is not ready; everything else (network, timeouts, pool
// exhaustion) is transient.
func classify(err error) remote.Class {
	if errors.Is(err, goredis.Nil) || errors.Is(err, remote.ErrCorrupt) || errors.Is(err, remote.ErrSizeMismatch) {
		return remote.Answered
	}
	var re goredis.Error
	if errors.As(err, &re) {
		for _, p := range []string{"LOADING", "BUSY", "TRYAGAIN", "MASTERDOWN", "CLUSTERDOWN"} {
			if goredis.HasErrorPrefix(err, p) {
				return remote.Transient
			}
		}
		return remote.Answered
	}
	return remote.Transient
}

// Name returns the configured tier name.
func (t *Tier) Name() string { return t.name }

// Type returns "redis".
func (t *Tier) Type() string { return Type }

// Medium returns CPU: Redis keeps blocks in (remote) DRAM.
func (t *Tier) Medium() offload.Medium { return offload.MediumCPU }

// Locality returns the configured locality.
func (t *Tier) Locality() offload.Locality { return t.locality }

// Healthy reports whether the server is considered up.
func (t *Tier) Healthy() bool { return t.health.Healthy() }

// Stats returns the tier's counters and gauges.
func (t *Tier) Stats() Stats {
	s := t.c.Snapshot()
	s.Healthy = t.health.Healthy()
	s.Downs = t.health.Downs()
	s.InFlightJobs = t.jobs.Active()
	if t.events != nil {
		s.EventsDropped = t.events.Dropped()
	}
	return Stats{Stats: s, ServerRemoved: t.serverRemoved.Load(), KeyspaceEvents: t.notify.Load()}
}

// Stats adds the Redis-specific figures to the common remote tier stats.
type Stats struct {
	remote.Stats
	// ServerRemoved counts blocks the server reported evicted, expired
	// or deleted through keyspace events.
	ServerRemoved int64
	// KeyspaceEvents is true while the server is known to publish them.
	KeyspaceEvents bool
}

// redisKey is the server key of k: prefix, hex hash, ':' and group.
func (t *Tier) redisKey(k offload.Key) string {
	h := k.HexHash()
	var sb strings.Builder
	sb.Grow(len(t.cfg.KeyPrefix) + len(h) + 11)
	sb.WriteString(t.cfg.KeyPrefix)
	sb.WriteString(h)
	sb.WriteByte(':')
	sb.WriteString(strconv.FormatUint(uint64(k.Group()), 10))
	return sb.String()
}

// parseKey inverts redisKey; ok is false for keys not written by a tier
// with this prefix.
func (t *Tier) parseKey(s string) (offload.Key, bool) {
	rest, ok := strings.CutPrefix(s, t.cfg.KeyPrefix)
	if !ok {
		return "", false
	}
	i := strings.LastIndexByte(rest, ':')
	if i <= 0 {
		return "", false
	}
	h, err := hex.DecodeString(rest[:i])
	if err != nil {
		return "", false
	}
	g, err := strconv.ParseUint(rest[i+1:], 10, 32)
	if err != nil {
		return "", false
	}
	k := offload.MakeKey(h, uint32(g))
	return k, k.Valid()
}

// Lookup answers from the pipelined existence checks: Retry until the
// check of key has run, then Hit or Miss. While the server is down it
// answers Miss without queueing anything.
func (t *Tier) Lookup(key offload.Key, req *offload.ReqContext) offload.LookupResult {
	t.c.Lookups.Add(1)
	if !t.health.Healthy() {
		t.c.LookupsUnhealthy.Add(1)
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

// SubmitStore writes the job's blocks in one pipeline. While the server
// is down the job fails at once (a skipped cascade).
func (t *Tier) SubmitStore(job *offload.Job) {
	if !t.health.Healthy() {
		t.c.StoreJobsSkipped.Add(1)
		t.jobs.Fail(job, fmt.Errorf("%s: store job %d: %w", t.label(), job.ID, remote.ErrUnavailable))
		return
	}
	if !t.jobs.Submit(job, t.runStore) {
		t.c.StoreJobsSkipped.Add(1)
	}
}

// SubmitLoad reads the job's blocks in one pipeline and verifies each
// before it reaches its slot. While the server is down the job fails at
// once and its keys answer Miss for the request.
func (t *Tier) SubmitLoad(job *offload.Job) {
	if !t.health.Healthy() {
		t.c.LoadJobsSkipped.Add(1)
		t.lookups.MarkMiss(job.Keys)
		t.jobs.Fail(job, fmt.Errorf("%s: load job %d: %w", t.label(), job.ID, remote.ErrUnavailable))
		return
	}
	if !t.jobs.Submit(job, t.runLoad) {
		t.c.LoadJobsSkipped.Add(1)
		t.lookups.MarkMiss(job.Keys)
	}
}

// FinishedJobs returns the results available since the previous call.
func (t *Tier) FinishedJobs() []offload.JobResult {
	res := t.jobs.Take()
	// Taken after the results: every result above queued its keys first.
	t.applyQueues()
	return res
}

func (t *Tier) applyQueues() {
	if keys := t.missQ.Take(); len(keys) > 0 {
		t.lookups.MarkMiss(keys)
	}
	if keys := t.forgetQ.Take(); len(keys) > 0 {
		t.lookups.Forget(keys)
	}
}

// DrainJobs waits until every submitted job has a result.
func (t *Tier) DrainJobs(ctx context.Context) error { return t.jobs.Drain(ctx) }

// HasPendingWork reports jobs in flight, results not yet taken, or
// existence checks queued or in flight.
func (t *Tier) HasPendingWork() bool { return t.jobs.Pending() || t.lookups.Pending() }

// Touch refreshes the blocks on the server in the background: their TTL
// when one is configured, else their LRU clock (TOUCH), so blocks the
// engine keeps using are the last the server evicts. It never blocks; a
// touch that finds the queue full is dropped.
func (t *Tier) Touch(keys []offload.Key, _ *offload.ReqContext) {
	if len(keys) == 0 || !t.health.Healthy() {
		return
	}
	select {
	case t.touches <- append([]offload.Key(nil), keys...):
	default:
	}
}

func (t *Tier) touchLoop() {
	defer t.wg.Done()
	for {
		select {
		case <-t.ctx.Done():
			return
		case keys := <-t.touches:
			ctx, cancel := context.WithTimeout(t.ctx, t.cfg.Timeout)
			pipe := t.client.Pipeline()
			for _, k := range keys {
				if t.cfg.TTL > 0 {
					pipe.PExpire(ctx, t.redisKey(k), t.cfg.TTL)
				} else {
					pipe.Touch(ctx, t.redisKey(k))
				}
			}
			pipe.Exec(ctx) // best effort: a failed touch only ages the block
			cancel()
		}
	}
}

// OnNewRequest answers BlockLevel.
func (t *Tier) OnNewRequest(*offload.ReqContext) offload.OffloadPolicy { return offload.BlockLevel }

// OnRequestFinished drops the request's lookup state.
func (t *Tier) OnRequestFinished(req *offload.ReqContext) { t.lookups.Cleanup(reqID(req)) }

// OnScheduleEnd sends this step's existence checks as one pipeline.
func (t *Tier) OnScheduleEnd(offload.ScheduleEnd) {
	t.applyQueues()
	t.lookups.Flush()
}

// TakeEvents returns the events since the previous call, in the order
// they happened (none when events are off).
func (t *Tier) TakeEvents() []offload.Event {
	if t.events == nil {
		return nil
	}
	return t.events.Take()
}

// Close cancels running transfers, waits for them until ctx ends, answers
// every outstanding job, stops the subscription and closes the
// connections. It is idempotent.
func (t *Tier) Close(ctx context.Context) error {
	t.closeOnce.Do(func() {
		t.closeErr = t.jobs.Close(ctx)
		t.lookups.Close()
		t.health.Close()
		t.cancel()
		t.wg.Wait()
		if err := t.client.Close(); err != nil && t.closeErr == nil {
			t.closeErr = fmt.Errorf("%s: close: %w", t.label(), err)
		}
	})
	return t.closeErr
}

// exists is the asynclookup batch function: one pipeline of EXISTS per
// batch. A failed pipeline makes the whole batch misses.
func (t *Tier) exists(ctx context.Context, keys []offload.Key) ([]bool, error) {
	if !t.health.Healthy() {
		return nil, fmt.Errorf("%s: %w", t.label(), remote.ErrUnavailable)
	}
	t.c.Probes.Add(int64(len(keys)))
	var cmds []*goredis.IntCmd
	err := t.probeRetry.Do(ctx, 0, func(ctx context.Context) error {
		pipe := t.client.Pipeline()
		cmds = make([]*goredis.IntCmd, len(keys))
		for i, k := range keys {
			cmds[i] = pipe.Exists(ctx, t.redisKey(k))
		}
		_, err := pipe.Exec(ctx)
		return err
	})
	if err != nil {
		t.c.ProbeErrors.Add(int64(len(keys)))
		return nil, fmt.Errorf("%s: exists: %w", t.label(), err)
	}
	found := make([]bool, len(keys))
	for i, c := range cmds {
		found[i] = c.Val() > 0
	}
	return found, nil
}

var sealPool = sync.Pool{New: func() any { return new([]byte) }}

func (t *Tier) runStore(ctx context.Context, job *offload.Job) offload.JobResult {
	start := time.Now()
	res := offload.JobResult{}
	fail := func(err error) offload.JobResult {
		t.c.StoreJobsFailed.Add(1)
		res.Err = err
		res.Duration = time.Since(start)
		return res
	}
	if len(job.Keys) == 0 {
		t.c.StoreJobsOK.Add(1)
		res.Success = true
		return res
	}
	if job.Arena == nil {
		return fail(fmt.Errorf("%s: store job %d: no arena", t.label(), job.ID))
	}
	if len(job.Slots) < len(job.Keys) {
		return fail(fmt.Errorf("%s: store job %d: %d slots for %d keys", t.label(), job.ID, len(job.Slots), len(job.Keys)))
	}
	if need := int64(remote.HeaderSize + job.Arena.SlotSize()); need > t.cfg.MaxValueBytes {
		return fail(fmt.Errorf("%s: store job %d: %w: %d-byte value, max_value_bytes %d", t.label(), job.ID, ErrValueTooLarge, need, t.cfg.MaxValueBytes))
	}
	bufs := make([]*[]byte, len(job.Keys))
	defer func() {
		for _, b := range bufs {
			if b != nil {
				sealPool.Put(b)
			}
		}
	}()
	for i, k := range job.Keys {
		if !k.Valid() {
			return fail(fmt.Errorf("%s: store: %w", t.label(), offload.ErrInvalidKey))
		}
		slot, err := job.Arena.Slot(job.Slots[i])
		if err != nil {
			return fail(fmt.Errorf("%s: store %s: %w", t.label(), k, err))
		}
		b := sealPool.Get().(*[]byte)
		*b = remote.Seal(*b, k, slot)
		bufs[i] = b
	}
	select {
	case t.ioSem <- struct{}{}:
	case <-ctx.Done():
		return fail(fmt.Errorf("%s: store job %d: %w", t.label(), job.ID, ctx.Err()))
	}
	defer func() { <-t.ioSem }()

	err := t.retry.Do(ctx, t.cfg.Retries, func(ctx context.Context) error {
		pipe := t.client.Pipeline()
		cmds := make([]*goredis.StatusCmd, len(job.Keys))
		for i, k := range job.Keys {
			cmds[i] = pipe.Set(ctx, t.redisKey(k), *bufs[i], t.cfg.TTL)
		}
		_, err := pipe.Exec(ctx)
		if err != nil {
			for i, c := range cmds {
				if c.Err() != nil {
					return fmt.Errorf("set %s: %w", job.Keys[i], c.Err())
				}
			}
		}
		return err
	})
	if err != nil {
		return fail(fmt.Errorf("%s: store job %d: %w", t.label(), job.ID, err))
	}
	n := int64(len(job.Keys))
	t.c.StoreJobsOK.Add(1)
	t.c.BlocksStored.Add(n)
	t.c.BytesWritten.Add(n * int64(job.Arena.SlotSize()))
	t.forgetQ.Add(job.Keys...)
	if t.events != nil {
		t.events.Add(offload.Event{Keys: job.Keys, Medium: offload.MediumCPU, Locality: t.locality, Tier: t.name})
	}
	res.Success = true
	res.Bytes = n * int64(job.Arena.SlotSize())
	res.Duration = time.Since(start)
	return res
}

func (t *Tier) runLoad(ctx context.Context, job *offload.Job) offload.JobResult {
	start := time.Now()
	n := len(job.Keys)
	errs := make([]error, n)
	slots := make([][]byte, n)
	valid := 0
	for i, k := range job.Keys {
		switch {
		case job.Arena == nil:
			errs[i] = fmt.Errorf("%s: load job %d: no arena", t.label(), job.ID)
		case i >= len(job.Slots):
			errs[i] = fmt.Errorf("%s: load %s: job has %d slots for %d keys", t.label(), k, len(job.Slots), n)
		case !k.Valid():
			errs[i] = fmt.Errorf("%s: load: %w", t.label(), offload.ErrInvalidKey)
		default:
			s, err := job.Arena.Slot(job.Slots[i])
			if err != nil {
				errs[i] = fmt.Errorf("%s: load %s: %w", t.label(), k, err)
			} else {
				slots[i] = s
				valid++
			}
		}
	}
	if valid > 0 {
		t.loadPipeline(ctx, job, slots, errs)
	}
	loaded, err := remote.Prefix(job.Keys, errs)
	res := offload.JobResult{Duration: time.Since(start)}
	if len(loaded) > 0 {
		res.Bytes = int64(len(loaded)) * int64(job.Arena.SlotSize())
	}
	if err == nil {
		t.c.LoadJobsOK.Add(1)
		res.Success = true
		return res
	}
	t.c.LoadJobsFailed.Add(1)
	res.Err = err
	res.SuccessfulKeys = loaded
	var failed []offload.Key
	for i, e := range errs {
		if e != nil {
			failed = append(failed, job.Keys[i])
		}
	}
	t.missQ.Add(failed...)
	return res
}

// loadPipeline GETs every key with a slot in one pipeline, verifies each
// value and only then copies it into its slot. GET returns one consistent
// value; a value that changed or vanished before the read is caught by
// the checksum or reads as missing, so it is never served.
func (t *Tier) loadPipeline(ctx context.Context, job *offload.Job, slots [][]byte, errs []error) {
	select {
	case t.ioSem <- struct{}{}:
	case <-ctx.Done():
		for i := range errs {
			if errs[i] == nil {
				errs[i] = ctx.Err()
			}
		}
		return
	}
	defer func() { <-t.ioSem }()

	var cmds []*goredis.StringCmd
	err := t.retry.Do(ctx, t.cfg.Retries, func(ctx context.Context) error {
		pipe := t.client.Pipeline()
		cmds = make([]*goredis.StringCmd, len(job.Keys))
		for i, k := range job.Keys {
			if slots[i] != nil {
				cmds[i] = pipe.Get(ctx, t.redisKey(k))
			}
		}
		_, err := pipe.Exec(ctx)
		if err != nil && !errors.Is(err, goredis.Nil) {
			for _, c := range cmds {
				if c != nil && c.Err() != nil && !errors.Is(c.Err(), goredis.Nil) {
					return c.Err()
				}
			}
			return err
		}
		return nil
	})
	for i, k := range job.Keys {
		if slots[i] == nil {
			continue
		}
		if err != nil {
			errs[i] = fmt.Errorf("%s: load %s: %w", t.label(), k, err)
			continue
		}
		val, gerr := cmds[i].Result()
		if errors.Is(gerr, goredis.Nil) {
			errs[i] = fmt.Errorf("%s: load %s: %w", t.label(), k, ErrNotFound)
			continue
		}
		if gerr != nil {
			errs[i] = fmt.Errorf("%s: load %s: %w", t.label(), k, gerr)
			continue
		}
		if verr := remote.OpenString(k, val, slots[i]); verr != nil {
			errs[i] = fmt.Errorf("%s: load %s: %w", t.label(), k, verr)
			switch {
			case errors.Is(verr, remote.ErrCorrupt):
				t.c.Corrupted.Add(1)
				t.log.Warn("corrupt block deleted", "key", k.String(), "err", verr)
				t.deleteCorrupt(ctx, k, val)
			case errors.Is(verr, remote.ErrSizeMismatch):
				t.c.SizeMismatch.Add(1)
			}
			continue
		}
		t.c.BlocksLoaded.Add(1)
		t.c.BytesRead.Add(int64(len(slots[i])))
	}
}

// deleteCorrupt removes k if it still holds the corrupt value val, and
// reports the removal unless keyspace events will.
func (t *Tier) deleteCorrupt(ctx context.Context, k offload.Key, val string) {
	var n int64
	err := t.retry.Do(ctx, 0, func(ctx context.Context) error {
		var err error
		n, err = deleteIfUnchanged.Run(ctx, t.client, []string{t.redisKey(k)}, val).Int64()
		return err
	})
	if err != nil {
		t.log.Warn("deleting corrupt block failed", "key", k.String(), "err", err)
		return
	}
	if n == 0 {
		return // replaced or gone since the read: nothing of ours to remove
	}
	t.c.Deleted.Add(1)
	if t.events != nil && !t.notify.Load() {
		t.events.Add(offload.Event{Keys: []offload.Key{k}, Medium: offload.MediumCPU, Locality: t.locality, Removed: true, Tier: t.name})
	}
}
