package workload

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"time"

	"github.com/kvtier/kvtier/config"
	"github.com/kvtier/kvtier/confvalue"
	"github.com/kvtier/kvtier/cpu"
	"github.com/kvtier/kvtier/explain"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/tiering"
	"github.com/kvtier/kvtier/tierset"
	"github.com/kvtier/kvtier/vfs"
)

// Defaults for Options.
const (
	// DefaultPrimaryBlocks is the Mooncake paper's "local DRAM" point:
	// 5 859 blocks of 512 tokens, about 3 M tokens.
	DefaultPrimaryBlocks = 5859
	// DefaultBlockBytes keeps the replay cheap: the bytes are copied on
	// every cascade and promotion but carry no meaning here, and an
	// unbounded in-memory secondary tier holds every distinct block of the
	// trace (182 790 for the conversation trace, 180 MiB at 1 KiB).
	DefaultBlockBytes = 1 << 10
	// DefaultMaxSettleSteps bounds the engine steps one request's lookup
	// may take to settle (promotions, asynchronous existence checks).
	DefaultMaxSettleSteps = 1000
	// DefaultSettleTimeout bounds the wall time one request waits for
	// slow tiers (simulated latency) to settle.
	DefaultSettleTimeout = 10 * time.Second
)

// Options configures a replay. The zero value replays through an LRU
// primary of DefaultPrimaryBlocks blocks with no secondary tier.
type Options struct {
	// PrimaryBlocks is the primary tier's capacity in blocks.
	PrimaryBlocks int
	// BlockBytes is the size of one block (a primary slot).
	BlockBytes int
	// Policy is the primary's eviction policy: "lru" (default) or "arc".
	Policy string
	// Config supplies the secondary tiers (in lookup order), the default
	// load and store filters and the validation mode; nil means none of
	// them. Its primary section is not used, and its
	// namespace.bytes_per_block is replaced by BlockBytes so that storage
	// tiers lay blocks out at the replayed size.
	Config *config.Config
	// Params is the kv_transfer_params (a JSON object) every request
	// sends; empty means none, so the config's default filters apply.
	Params []byte
	// HitPendingOnPromotion is tiering.Config's switch of the same name.
	HitPendingOnPromotion bool
	// MaxSettleSteps and SettleTimeout bound how long one request's lookup
	// may take to settle; a request that has not settled by then is
	// served the hits found so far and counted in Result.Unsettled.
	MaxSettleSteps int
	SettleTimeout  time.Duration
	// Logger receives the tiers' and the manager's logs; nil discards.
	Logger *slog.Logger

	// Timed replays the trace at its recorded arrival times, divided by
	// Speedup, with an engine that steps every Step of wall time: requests
	// overlap, a request waits (re-looking its prefix up every step) while
	// its promotions run, and a store completes one step after it was
	// prepared, so tier I/O competes with time as in production. Without
	// it requests run back to back as fast as the stack answers.
	Timed bool
	// Speedup divides the trace's inter-arrival times (0: 1, real time).
	Speedup float64
	// Step is the modelled engine step (0: DefaultStep).
	Step time.Duration
	// WaitSteps bounds the steps a request of a timed replay waits for its
	// promotions before it is served with the hits it has (0:
	// DefaultWaitSteps). While it waits it holds the blocks that already
	// answered HIT (a lookup lease), as the engine's connector does.
	WaitSteps int
	// Budget is the manager's cascade pin budget (zero: the default).
	Budget tiering.BudgetConfig
	// FreshTiers runs each fs tier in a new directory under its root_dir,
	// removed after the replay, so that the replay starts from an empty
	// tier and two replays are comparable. Other persistent tiers (s3,
	// redis) keep what they hold; a warning says so.
	FreshTiers bool
	// FS, if set, gives the filesystem of each fs tier by name
	// (tierset.Options.FS), e.g. a vfstest.Injector with delays.
	FS func(tier string) vfs.FS
	// Noise, if set, adds a noisy neighbour: a second tenant storing
	// blocks no one reads, after every request (noise.go). Not with
	// Timed.
	Noise *Noise
	// Progress, if set, is called about every ProgressEvery with the
	// requests replayed so far and their hit rate.
	Progress      func(Progress)
	ProgressEvery time.Duration
}

// DefaultStep is the modelled engine step of a timed replay: a decode
// step of a mid-sized model on one GPU.
const DefaultStep = 10 * time.Millisecond

// DefaultWaitSteps is the longest a request of a timed replay waits for
// its promotions: 50 steps, half a second at DefaultStep.
const DefaultWaitSteps = 50

// Progress is a replay's progress so far.
type Progress struct {
	Requests int
	HitRate  float64
	Elapsed  time.Duration
	// Behind is how far a timed replay lags its schedule.
	Behind time.Duration
}

func (o Options) withDefaults() (Options, error) {
	if o.PrimaryBlocks == 0 {
		o.PrimaryBlocks = DefaultPrimaryBlocks
	}
	if o.BlockBytes == 0 {
		o.BlockBytes = DefaultBlockBytes
	}
	if o.Policy == "" {
		o.Policy = cpu.PolicyLRU
	}
	if o.MaxSettleSteps == 0 {
		o.MaxSettleSteps = DefaultMaxSettleSteps
	}
	if o.SettleTimeout == 0 {
		o.SettleTimeout = DefaultSettleTimeout
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Speedup == 0 {
		o.Speedup = 1
	}
	if o.Step == 0 {
		o.Step = DefaultStep
	}
	if o.WaitSteps == 0 {
		o.WaitSteps = DefaultWaitSteps
	}
	if o.ProgressEvery == 0 {
		o.ProgressEvery = time.Second
	}
	switch {
	case !(o.Speedup > 0) || o.Speedup > 1e6:
		return o, fmt.Errorf("workload: speed-up %v: want a factor in (0, 1e6]", o.Speedup)
	case o.Step < 0:
		return o, fmt.Errorf("workload: step %v: want > 0", o.Step)
	case o.WaitSteps < 0:
		return o, fmt.Errorf("workload: wait steps %d: want > 0", o.WaitSteps)
	case o.PrimaryBlocks < 0:
		return o, fmt.Errorf("workload: primary blocks %d: want > 0", o.PrimaryBlocks)
	case o.BlockBytes < 0:
		return o, fmt.Errorf("workload: block bytes %d: want > 0", o.BlockBytes)
	case o.MaxSettleSteps < 0 || o.SettleTimeout < 0:
		return o, errors.New("workload: settle bounds must not be negative")
	case o.Noise != nil && o.Timed:
		return o, errors.New("workload: a noisy neighbour is for back-to-back replays, not timed ones")
	}
	if o.Noise != nil {
		if err := o.Noise.check(o.PrimaryBlocks); err != nil {
			return o, err
		}
	}
	return o, nil
}

// Result is what a replay measured. Block counts are keys: one trace
// hash id is one key (KV group 0).
type Result struct {
	Requests int    `json:"requests"`
	Blocks   uint64 `json:"blocks"`
	// HitBlocks are the matched leading blocks of every request once its
	// lookup settled: PrimaryHitBlocks were in the primary at the first
	// lookup, PromotedHitBlocks were promoted from a secondary tier (see
	// TierResult.HitBlocks for which).
	HitBlocks         uint64 `json:"hit_blocks"`
	PrimaryHitBlocks  uint64 `json:"primary_hit_blocks"`
	PromotedHitBlocks uint64 `json:"promoted_hit_blocks"`
	// UnattributedHitBlocks are promoted hits no tier could be credited
	// with: in a timed replay one promotion may serve several waiting
	// requests, and each tier is credited with the blocks it promoted.
	UnattributedHitBlocks uint64 `json:"unattributed_hit_blocks,omitempty"`
	// HitRate is HitBlocks / Blocks, the prefix hit rate.
	HitRate float64 `json:"hit_rate"`
	// Unsettled counts requests whose lookup had not settled within the
	// bounds; StoresRejected counts requests whose missing blocks the
	// primary could not make room for (all pinned or pending).
	Unsettled      int `json:"unsettled"`
	StoresRejected int `json:"stores_rejected"`
	// Steps counts engine steps (ScheduleEnd calls).
	Steps uint64 `json:"steps"`

	Primary PrimaryResult `json:"primary"`
	Tiers   []TierResult  `json:"tiers"`

	// Elapsed is the wall time of the replay loop (tiers built, trace
	// source excluded when it is in memory); the rates derive from it.
	Elapsed        time.Duration `json:"elapsed_ns"`
	RequestsPerSec float64       `json:"requests_per_sec"`
	NsPerKey       float64       `json:"ns_per_key"`

	// Warnings are the problems a lenient parse found in Params.
	Warnings []string `json:"warnings"`

	// Timed describes a timed replay (nil otherwise).
	Timed *TimedResult `json:"timed,omitempty"`
	// Noise describes the noisy neighbour (nil without one); the other
	// figures are the trace's tenant's.
	Noise *NoiseResult `json:"noise,omitempty"`
}

// TimedResult describes how a timed replay kept to the trace's clock.
type TimedResult struct {
	Speedup float64       `json:"speedup"`
	Step    time.Duration `json:"step_ns"`
	// TraceSpan is the trace time covered (last arrival − first).
	TraceSpan time.Duration `json:"trace_span_ns"`
	// MaxBehind is the largest lag of a step behind its schedule: a
	// replay that cannot keep up runs late rather than skipping work.
	MaxBehind time.Duration `json:"max_behind_ns"`
	// MaxWaiting is the most requests waiting for promotions at once;
	// WaitSteps counts the steps requests spent waiting, in all.
	MaxWaiting int    `json:"max_waiting"`
	WaitSteps  uint64 `json:"wait_steps"`
}

// PrimaryResult describes the primary tier after the replay.
type PrimaryResult struct {
	Blocks     int    `json:"blocks"` // capacity in blocks
	BlockBytes int    `json:"block_bytes"`
	Policy     string `json:"policy"`
	Held       int    `json:"held"` // blocks held at the end
	// StoredBlocks counts completed stores, promotions included.
	StoredBlocks uint64 `json:"stored_blocks"`
	Evictions    uint64 `json:"evictions"`
}

// TierResult describes one secondary tier's part in the replay.
type TierResult struct {
	Name     string `json:"name"`
	Type     string `json:"type"`
	Medium   string `json:"medium"`
	Locality string `json:"locality"`
	// HitBlocks are hit blocks this tier served by promotion.
	HitBlocks uint64 `json:"hit_blocks"`
	// Lookups the tier answered Hit, and lookups its load filter kept
	// from it.
	LookupHits      uint64 `json:"lookup_hits"`
	SkippedByFilter uint64 `json:"skipped_by_filter"`
	// Promotions (loads into the primary), by block.
	PromotedBlocks        uint64 `json:"promoted_blocks"`
	PromotionBlocksFailed uint64 `json:"promotion_blocks_failed"`
	PromotionsRejected    uint64 `json:"promotions_rejected"`
	// Cascades (stores from the primary): jobs by outcome and blocks.
	CascadesOK      uint64 `json:"cascades_ok"`
	CascadesFailed  uint64 `json:"cascades_failed"`
	CascadesDropped uint64 `json:"cascades_dropped"`
	// DroppedBy splits CascadesDropped by reason (tiering.DropReason);
	// CascadeBlocksDropped counts their blocks.
	DroppedBy               map[string]uint64 `json:"dropped_by"`
	CascadeBlocksDropped    uint64            `json:"cascade_blocks_dropped"`
	CascadesSkippedByFilter uint64            `json:"cascades_skipped_by_filter"`
	CascadedBlocks          uint64            `json:"cascaded_blocks"`
	// CascadeBlocksRevoked counts blocks eviction took back from the
	// tier's cascades in flight (tiering.TierStats).
	CascadeBlocksRevoked uint64 `json:"cascade_blocks_revoked"`
	// Evictions counts blocks the tier reported removed (only tiers that
	// emit events report them); Held is the blocks it holds at the end,
	// HeldAtStart those it held before the replay (an fs tier keeps the
	// files of earlier runs), -1 when the tier cannot say. A tier may hold
	// more than HeldAtStart + CascadedBlocks: a revoked block (counted in
	// CascadeBlocksRevoked, not in CascadedBlocks) is kept if the tier had
	// written it before eviction took it back.
	Evictions   uint64 `json:"evictions"`
	Held        int    `json:"held"`
	HeldAtStart int    `json:"held_at_start"`
}

// tierLen is the blocks a tier holds, -1 when it cannot say.
func tierLen(t offload.SecondaryTier) int {
	if l, ok := t.(interface{ Len() int }); ok {
		return l.Len()
	}
	return -1
}

// KeyOf returns the offload key of a trace hash id: the id as 8 bytes
// big-endian, in KV group 0 (offload.MakeKey's layout).
func KeyOf(id uint64) offload.Key {
	var b [8 + offload.GroupSuffixLen]byte
	binary.BigEndian.PutUint64(b[:8], id)
	return offload.Key(b[:])
}

// Replay builds a primary, the config's secondary tiers and a manager,
// replays src through them and closes them. An error from src (a
// malformed trace line) or from the manager ends the replay.
func Replay(ctx context.Context, src Source, opts Options) (*Result, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	cfg := config.Default()
	if opts.Config != nil {
		c := *opts.Config
		cfg = &c
	}
	cfg.Namespace.BytesPerBlock = confvalue.ByteSize(opts.BlockBytes)
	var warnings []string
	if opts.FreshTiers {
		scratch, w, err := freshTiers(cfg)
		defer func() {
			for _, d := range scratch {
				os.RemoveAll(d)
			}
		}()
		if err != nil {
			return nil, err
		}
		warnings = w
	}

	d, err := newNode(ctx, cfg, opts, nodeExtras{})
	if err != nil {
		return nil, fmt.Errorf("workload: %w", err)
	}
	m := d.m
	d.res.Warnings = append(d.res.Warnings, warnings...)
	run := d.run
	if opts.Timed {
		run = d.runTimed
	}
	res, err := run(ctx, src)
	if cerr := m.Close(context.WithoutCancel(ctx)); cerr != nil {
		err = errors.Join(err, fmt.Errorf("workload: close: %w", cerr))
	}
	if err != nil {
		return nil, err
	}
	return res, nil
}

// nodeExtras is what a fleet node adds to a replay node.
type nodeExtras struct {
	// primaryEvents makes the primary report its stores and evictions
	// (a fleet router indexes them).
	primaryEvents bool
	// tiers come after the config's tiers in lookup order.
	tiers func() []offload.SecondaryTier
}

// newNode builds one replay node — a primary, cfg's secondary tiers (and
// extra's), a manager — and its driver.
func newNode(ctx context.Context, cfg *config.Config, opts Options, extra nodeExtras) (*driver, error) {
	tmpl, err := cfg.Parser().NewReqContext("params", opts.Params)
	if err != nil {
		return nil, fmt.Errorf("params: %w", err)
	}
	primary, err := cpu.New(cpu.Config{
		SlotSize: opts.BlockBytes,
		Capacity: int64(opts.PrimaryBlocks) * int64(opts.BlockBytes),
		Policy:   opts.Policy,
		Events:   extra.primaryEvents,
		Shares:   opts.Noise.shares(opts.PrimaryBlocks),
	})
	if err != nil {
		return nil, fmt.Errorf("primary: %w", err)
	}
	tiers, err := tierset.Build(ctx, cfg, tierset.Options{Logger: opts.Logger, FS: opts.FS})
	if err != nil {
		return nil, errors.Join(err, primary.Close())
	}
	if extra.tiers != nil {
		tiers = append(tiers, extra.tiers()...)
	}
	m, err := tiering.New(tiering.Config{
		Primary:               primary,
		Tiers:                 tiers,
		Logger:                opts.Logger,
		HitPendingOnPromotion: opts.HitPendingOnPromotion,
		Budget:                opts.Budget,
	})
	if err != nil {
		for _, t := range tiers {
			err = errors.Join(err, t.Close(ctx))
		}
		return nil, errors.Join(err, primary.Close())
	}
	d := newDriver(m, primary.Policy(), opts, tmpl)
	d.primary = primary
	return d, nil
}

// freshTiers points each fs tier of cfg (a copy) at a new directory under
// its root_dir and returns the directories, and a warning for every other
// tier that keeps blocks across replays.
func freshTiers(cfg *config.Config) (dirs, warnings []string, err error) {
	specs := slices.Clone(cfg.SecondaryTiers)
	for i, t := range specs {
		switch t.Type {
		case "fs":
			root := t.Value("root_dir")
			if root == "" {
				continue // the tier's own error names the missing key
			}
			if err := os.MkdirAll(root, 0o700); err != nil {
				return dirs, nil, fmt.Errorf("workload: tier %q: %w", t.Name, err)
			}
			d, err := os.MkdirTemp(root, ".kvtier-bench-")
			if err != nil {
				return dirs, nil, fmt.Errorf("workload: tier %q: %w", t.Name, err)
			}
			dirs = append(dirs, d)
			specs[i] = t.With("root_dir", d)
		case "s3", "redis":
			warnings = append(warnings, fmt.Sprintf("tier %q (%s) is not emptied before the replay: blocks it holds from earlier runs count as hits", t.Name, t.Type))
		}
	}
	cfg.SecondaryTiers = specs
	return dirs, warnings, nil
}

// driver replays requests through one manager.
type driver struct {
	m      *tiering.Manager
	opts   Options
	policy string // the primary's, normalised
	tmpl   *offload.ReqContext
	res    Result

	seq       uint64
	keys      []offload.Key
	out       []offload.LookupResult
	first     []offload.LookupResult
	newIDs    [1]string
	promoted  []uint64 // per tier: PromotedBlocks before the request
	tierHits  []uint64
	evictions map[string]uint64
	heldStart []int // each tier's blocks before the replay (-1: it cannot say)
	lastProg  time.Time
	start     time.Time
	// onEvents, when set, sees every batch of the manager's events (a
	// fleet replay's router indexes the primary's).
	onEvents func([]offload.Event)
	primary  *cpu.Primary

	// The noisy neighbour's (noise.go).
	noiseSeq, noiseKey uint64
	noiseRes           NoiseResult
}

func newDriver(m *tiering.Manager, policy string, opts Options, tmpl *offload.ReqContext) *driver {
	n := len(m.Tiers())
	d := &driver{
		m:         m,
		opts:      opts,
		policy:    policy,
		tmpl:      tmpl,
		promoted:  make([]uint64, n),
		tierHits:  make([]uint64, n),
		evictions: make(map[string]uint64),
		heldStart: make([]int, n),
	}
	for i, t := range m.Tiers() {
		d.heldStart[i] = tierLen(t)
	}
	for _, w := range tmpl.Warnings {
		d.res.Warnings = append(d.res.Warnings, w.Message)
	}
	return d
}

func (d *driver) run(ctx context.Context, src Source) (*Result, error) {
	start := time.Now()
	d.start = start
	for {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("workload: replay stopped after %d requests: %w", d.res.Requests, err)
		}
		req, err := src.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("workload: after %d requests: %w", d.res.Requests, err)
		}
		if err := d.request(ctx, req); err != nil {
			return nil, fmt.Errorf("workload: request at trace line %d: %w", req.Line, err)
		}
		if err := d.noise(); err != nil {
			return nil, fmt.Errorf("workload: noise after trace line %d: %w", req.Line, err)
		}
		d.progress(0)
	}
	d.drain(ctx)
	d.res.Elapsed = time.Since(start)
	d.collect()
	return &d.res, nil
}

// request replays one request as vLLM's offloading connector would: look
// the prefix up, step until promotions settle, load the hit prefix,
// prepare the store of the missing blocks, touch the request's blocks,
// complete the store and finish the request.
func (d *driver) request(ctx context.Context, req Request) error {
	m := d.m
	d.seq++
	rc := new(offload.ReqContext)
	*rc = *d.tmpl // the parsed params are shared, read-only
	rc.ID = "r" + strconv.FormatUint(d.seq, 10)
	policy := m.OnNewRequest(rc)

	n := len(req.HashIDs)
	d.keys = d.keys[:0]
	for _, id := range req.HashIDs {
		d.keys = append(d.keys, d.keyOf(id))
	}
	keys := d.keys
	if cap(d.out) < n {
		d.out = make([]offload.LookupResult, n)
		d.first = make([]offload.LookupResult, n)
	}
	out, first := d.out[:n], d.first[:n]

	d.newIDs[0] = rc.ID
	se := offload.ScheduleEnd{NewReqIDs: d.newIDs[:]}

	m.LookupPrefix(keys, rc, out)
	copy(first, out)
	settled := isSettled(out)
	if !settled {
		d.snapshotPromoted()
		settled = d.settle(ctx, keys, rc, out, &se)
		if !settled {
			d.res.Unsettled++
		}
	}

	hits := 0
	for hits < n && out[hits] == offload.Hit {
		hits++
	}
	primaryHits := 0
	for _, r := range first[:hits] {
		if r == offload.Hit {
			primaryHits++
		}
	}
	if promoted := hits - primaryHits; promoted > 0 {
		d.attribute(uint64(promoted))
	}
	d.res.Requests++
	d.res.Blocks += uint64(n)
	d.res.HitBlocks += uint64(hits)
	d.res.PrimaryHitBlocks += uint64(primaryHits)
	d.res.PromotedHitBlocks += uint64(hits - primaryHits)

	if hits > 0 {
		if _, err := m.PrepareLoad(keys[:hits], rc); err != nil {
			return err
		}
		if err := m.CompleteLoad(keys[:hits], rc); err != nil {
			return err
		}
	}
	toStore := keys[hits:]
	if policy == offload.RequestLevel {
		toStore = keys // prefix hits are offered again for request-level tiers
	}
	if len(toStore) > 0 {
		ps, ok, err := m.PrepareStore(toStore, rc)
		if err != nil {
			return err
		}
		if !ok {
			d.res.StoresRejected++
		} else if len(ps.KeysToStore) > 0 {
			// vLLM touches the request's blocks once their store is
			// prepared and before it completes: the prefix is refreshed
			// and the new blocks, still pending, are not (they are
			// seen once, which matters to ARC).
			m.Touch(keys, rc)
			if err := m.CompleteStore(ps.KeysToStore, rc, true); err != nil {
				return err
			}
		}
	}
	m.ScheduleEnd(se)
	d.res.Steps++
	m.OnRequestFinished(rc)
	d.takeEvents()
	clear(d.keys) // do not keep the request's keys alive in scratch
	return nil
}

// progress reports progress when it is due.
func (d *driver) progress(behind time.Duration) {
	if d.opts.Progress == nil {
		return
	}
	now := time.Now()
	if now.Sub(d.lastProg) < d.opts.ProgressEvery {
		return
	}
	d.lastProg = now
	p := Progress{Requests: d.res.Requests, Elapsed: now.Sub(d.start), Behind: behind}
	if d.res.Blocks > 0 {
		p.HitRate = float64(d.res.HitBlocks) / float64(d.res.Blocks)
	}
	d.opts.Progress(p)
}

// isSettled reports a lookup with no Retry and no HitPending answer: the
// count of leading Hits is final.
func isSettled(out []offload.LookupResult) bool {
	for _, r := range out {
		if r == offload.Retry || r == offload.HitPending {
			return false
		}
	}
	return true
}

// settle steps the manager and looks the prefix up again until the
// answers settle or the bounds are reached. While tiers have work in
// flight and a step changed nothing, it backs off briefly so that slow
// tiers (simulated latency) get wall time without a busy loop.
func (d *driver) settle(ctx context.Context, keys []offload.Key, rc *offload.ReqContext, out []offload.LookupResult, se *offload.ScheduleEnd) bool {
	m := d.m
	var deadline time.Time
	backoff := 10 * time.Microsecond
	for step := 0; step < d.opts.MaxSettleSteps; step++ {
		m.ScheduleEnd(*se)
		d.res.Steps++
		se.NewReqIDs = nil
		before := leadingHits(out)
		m.LookupPrefix(keys, rc, out)
		if isSettled(out) {
			return true
		}
		if leadingHits(out) > before || !m.HasPendingWork() {
			continue
		}
		now := time.Now()
		if deadline.IsZero() {
			deadline = now.Add(d.opts.SettleTimeout)
		} else if now.After(deadline) || ctx.Err() != nil {
			return false
		}
		time.Sleep(backoff)
		backoff = min(2*backoff, time.Millisecond)
	}
	return false
}

func leadingHits(out []offload.LookupResult) int {
	n := 0
	for n < len(out) && out[n] == offload.Hit {
		n++
	}
	return n
}

// snapshotPromoted records each tier's promoted blocks before a settle,
// so that the promoted hits can be attributed to tiers afterwards.
func (d *driver) snapshotPromoted() {
	for i, ts := range d.m.Stats().Tiers {
		d.promoted[i] = ts.PromotedBlocks
	}
}

// attribute credits n promoted hit blocks to the tiers whose promotions
// completed during the request, in lookup order. Promotions of an earlier
// request that completed late are credited here too, which only matters
// with slow tiers.
func (d *driver) attribute(n uint64) {
	for i, ts := range d.m.Stats().Tiers {
		if n == 0 {
			return
		}
		delta := min(ts.PromotedBlocks-d.promoted[i], n)
		d.tierHits[i] += delta
		n -= delta
	}
}

// takeEvents counts the blocks tiers reported removed. The primary's
// evictions come from its stats (a plain replay builds it without events).
func (d *driver) takeEvents() {
	evs := d.m.TakeEvents()
	if d.onEvents != nil {
		d.onEvents(evs)
	}
	for _, ev := range evs {
		if ev.Removed && ev.Tier != "" {
			d.evictions[ev.Tier] += uint64(len(ev.Keys))
		}
	}
}

// drain steps the manager until the last cascades have completed, so that
// the stats count them.
func (d *driver) drain(ctx context.Context) {
	deadline := time.Now().Add(d.opts.SettleTimeout)
	for d.m.HasPendingWork() && time.Now().Before(deadline) && ctx.Err() == nil {
		d.m.ScheduleEnd(offload.ScheduleEnd{})
		d.res.Steps++
		if d.m.HasPendingWork() {
			time.Sleep(100 * time.Microsecond)
		}
	}
	d.takeEvents()
}

// collect fills the result from the manager's stats.
func (d *driver) collect() {
	st := d.m.Stats()
	r := &d.res
	if n := d.opts.Noise; n != nil {
		d.noiseRes.BlocksPerRequest, d.noiseRes.TraceQuota = n.BlocksPerRequest, n.TraceQuota
		r.Noise = &d.noiseRes
	}
	r.Primary = PrimaryResult{
		Blocks:       st.Primary.NumSlots,
		BlockBytes:   st.Primary.SlotSize,
		Policy:       d.policy,
		Held:         st.Primary.Blocks,
		StoredBlocks: st.Primary.StoredBlocks,
		Evictions:    st.Primary.Evictions,
	}
	tiers := d.m.Tiers()
	r.Tiers = make([]TierResult, len(st.Tiers))
	for i, ts := range st.Tiers {
		decl := explain.DeclarationOf(tiers[i])
		held := tierLen(tiers[i])
		r.Tiers[i] = TierResult{
			Name:                    ts.Name,
			Type:                    ts.Type,
			Medium:                  decl.MediumString(),
			Locality:                decl.LocalityString(),
			HitBlocks:               d.tierHits[i],
			LookupHits:              ts.Hits,
			SkippedByFilter:         ts.SkippedByFilter,
			PromotedBlocks:          ts.PromotedBlocks,
			PromotionBlocksFailed:   ts.PromotionBlocksFailed,
			PromotionsRejected:      ts.PromotionsRejected,
			CascadesOK:              ts.CascadesOK,
			CascadesFailed:          ts.CascadesFailed,
			CascadesDropped:         ts.CascadesDropped,
			DroppedBy:               dropMap(ts.DroppedBy),
			CascadeBlocksDropped:    ts.CascadeBlocksDropped,
			CascadesSkippedByFilter: ts.CascadesSkippedByFilter,
			CascadedBlocks:          ts.CascadedBlocks,
			CascadeBlocksRevoked:    ts.CascadeBlocksRevoked,
			Evictions:               d.evictions[ts.Name],
			Held:                    held,
			HeldAtStart:             d.heldStart[i],
		}
	}
	if r.Blocks > 0 {
		r.HitRate = float64(r.HitBlocks) / float64(r.Blocks)
		r.NsPerKey = float64(r.Elapsed.Nanoseconds()) / float64(r.Blocks)
	}
	if r.Elapsed > 0 {
		r.RequestsPerSec = float64(r.Requests) / r.Elapsed.Seconds()
	}
	if r.Warnings == nil {
		r.Warnings = []string{}
	}
}

// dropMap names the drop counters by reason.
func dropMap(by [tiering.NumDropReasons]uint64) map[string]uint64 {
	m := make(map[string]uint64, len(by))
	for r, v := range by {
		m[tiering.DropReason(r).String()] = v
	}
	return m
}
