package region

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/tiering"
)

// Sentinel errors callers test.
var (
	// ErrUnknownRegion reports a region id no registration gave (or one
	// that has been closed).
	ErrUnknownRegion = errors.New("unknown region")
	// ErrClosed reports a call on a closed region or service.
	ErrClosed = errors.New("region closed")
	// ErrLimit reports a call over one of the service's bounds.
	ErrLimit = errors.New("region limit")
)

// Config configures a Service.
type Config struct {
	// Tiers builds the secondary tiers of a namespace: the daemon's
	// configured stack, laid out for it (its fs directories, s3 prefixes
	// and redis keys named after ns). It is called once per namespace,
	// when an engine first registers a region of it.
	Tiers func(ctx context.Context, ns string, l Layout) ([]offload.SecondaryTier, error)
	// Parse builds a request's context from its raw kv_transfer_params
	// (nil for none): the daemon's parser, with its default filters and
	// strict mode.
	Parse func(id string, params []byte) (*offload.ReqContext, error)
	// Logger (nil discards).
	Logger *slog.Logger
	// Admission configures back-pressure of every namespace's stack.
	Admission tiering.AdmissionConfig
	// MaxRegions bounds the regions registered at once (default 64).
	MaxRegions int
	// MaxRequests bounds the requests one region has state for (default
	// 65536).
	MaxRequests int
	// LookupWait bounds how long a lookup waits for tiers that answer
	// asynchronously (fs, s3, redis) before it answers "unknown" for the
	// keys they have not settled (default 2s).
	LookupWait time.Duration
	// Tick is how often a namespace's executor polls its tiers while work
	// is pending (default 1ms).
	Tick time.Duration
	// MaxEvents bounds the events buffered for one region between two of
	// its steps (default 65536); older ones are dropped and counted.
	MaxEvents int
	// RequestIdle drops the state of a request no call has named for this
	// long (default 10m): an engine that lost its finish.
	RequestIdle time.Duration
	// CloseWait bounds how long closing a region waits for its transfers
	// in flight (default 30s). A region whose transfers outlive it stays
	// mapped (the transfers keep valid memory) and is logged.
	CloseWait time.Duration
}

func (c Config) withDefaults() (Config, error) {
	if c.Tiers == nil || c.Parse == nil {
		return c, errors.New("region: Config.Tiers and Config.Parse are required")
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&c.MaxRegions, 64)
	def(&c.MaxRequests, 65536)
	def(&c.MaxEvents, 65536)
	defDur := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	defDur(&c.LookupWait, 2*time.Second)
	defDur(&c.Tick, time.Millisecond)
	defDur(&c.RequestIdle, 10*time.Minute)
	defDur(&c.CloseWait, 30*time.Second)
	return c, nil
}

// Service is the registry of regions and of the namespaces they belong
// to. It is safe for concurrent use.
type Service struct {
	cfg Config

	mu      sync.Mutex
	groups  map[string]*group
	regions map[string]*Region
	closed  bool
}

// New returns an empty service.
func New(cfg Config) (*Service, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Service{cfg: cfg, groups: make(map[string]*group), regions: make(map[string]*Region)}, nil
}

// Register maps f, an engine's region laid out as l, and returns it bound
// to its namespace (created, with its tiers, on first use). The file is
// only read for the mapping: the caller may close it afterwards.
func (s *Service) Register(ctx context.Context, l Layout, f *os.File) (*Region, error) {
	if err := l.Validate(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, ErrClosed
	}
	if len(s.regions) >= s.cfg.MaxRegions {
		s.mu.Unlock()
		return nil, fmt.Errorf("%w: %d regions registered (the most the daemon takes)", ErrLimit, len(s.regions))
	}
	s.mu.Unlock()

	m, err := mapRegion(f, l)
	if err != nil {
		return nil, err
	}
	g, err := s.group(ctx, l)
	if err != nil {
		m.unmap()
		return nil, err
	}
	var idb [16]byte
	rand.Read(idb[:])
	r := &Region{
		id: hex.EncodeToString(idb[:]), layout: l, g: g, m: m, svc: s,
		notify: make(chan struct{}, 1), drained: make(chan struct{}),
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		m.unmap()
		return nil, ErrClosed
	}
	s.regions[r.id] = r
	s.mu.Unlock()
	added := make(chan struct{})
	if err := g.do(ctx, func() { g.regions[r] = struct{}{}; close(added) }); err != nil {
		s.forget(r)
		m.unmap()
		return nil, err
	}
	select {
	case <-added:
	case <-g.done:
		s.forget(r)
		m.unmap()
		return nil, ErrClosed
	}
	s.cfg.Logger.Info("region registered", "region", r.id, "namespace", g.name, "blocks", l.NumBlocks, "row_stride", l.RowStride, "model", l.Model)
	return r, nil
}

// group returns the namespace of l, building it (and its tiers) on first
// use.
func (s *Service) group(ctx context.Context, l Layout) (*group, error) {
	name := l.Namespace()
	s.mu.Lock()
	defer s.mu.Unlock()
	if g := s.groups[name]; g != nil {
		return g, nil
	}
	tiers, err := s.cfg.Tiers(ctx, name, l)
	if err != nil {
		return nil, fmt.Errorf("region: build the tiers of namespace %s: %w", name, err)
	}
	g, err := newGroup(s, name, l.RowStride, tiers)
	if err != nil {
		return nil, err
	}
	s.groups[name] = g
	s.cfg.Logger.Info("region namespace created", "namespace", name, "tiers", len(tiers))
	return g, nil
}

// ErrNoNamespace reports a namespace no region has registered.
var ErrNoNamespace = errors.New("region: no such namespace")

// Residency answers which of the namespace's tiers hold the leading keys
// of a prefix, for the load filter of params, changing nothing in any
// tier (tiering.Stack.ResidencyAlone: the engine's own CPU tier is not
// known here). The warnings are params' under the parser's rules.
func (s *Service) Residency(ctx context.Context, namespace string, keys []offload.Key, params []byte) (tiering.Residency, []offload.Warning, error) {
	s.mu.Lock()
	g := s.groups[namespace]
	s.mu.Unlock()
	if g == nil {
		return tiering.Residency{}, nil, fmt.Errorf("%w: %q", ErrNoNamespace, namespace)
	}
	rc, err := s.cfg.Parse("residency", params)
	if err != nil {
		return tiering.Residency{}, nil, err
	}
	reply := make(chan tiering.Residency, 1)
	if err := g.do(ctx, func() { reply <- g.stack.ResidencyAlone(keys, rc.LoadFilter) }); err != nil {
		return tiering.Residency{}, nil, err
	}
	select {
	case r := <-reply:
		return r, rc.Warnings, nil
	case <-ctx.Done():
		return tiering.Residency{}, nil, ctx.Err()
	}
}

// Region returns the registered region id.
func (s *Service) Region(id string) (*Region, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.regions[id]
	if r == nil {
		return nil, fmt.Errorf("%w %q (register the region first, over the region socket)", ErrUnknownRegion, id)
	}
	return r, nil
}

func (s *Service) forget(r *Region) {
	s.mu.Lock()
	delete(s.regions, r.id)
	s.mu.Unlock()
}

// Close closes every region (waiting for its transfers, bounded by ctx)
// and every namespace's tiers.
func (s *Service) Close(ctx context.Context) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	regions := make([]*Region, 0, len(s.regions))
	for _, r := range s.regions {
		regions = append(regions, r)
	}
	groups := make([]*group, 0, len(s.groups))
	for _, g := range s.groups {
		groups = append(groups, g)
	}
	s.mu.Unlock()
	var errs []error
	for _, r := range regions {
		if err := r.Close(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	for _, g := range groups {
		if err := g.close(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// NamespaceStats describes one namespace.
type NamespaceStats struct {
	Name     string
	Regions  int
	Requests int
	// Jobs counts the engines' jobs in flight.
	Jobs  int
	Tiers []tiering.TierStats
	// TierObjects are the tiers themselves, co-indexed with Tiers (for
	// figures only some kinds keep).
	TierObjects []offload.SecondaryTier
	// RowStride is the namespace's block size.
	RowStride int
	// EventsDropped counts events dropped because a region's buffer was
	// full (its engine did not step).
	EventsDropped uint64
	// LookupKeys counts the keys the engines' lookups answered, indexed by
	// Found: Unknown ones the engine asks again a step later (a deferral).
	LookupKeys [3]uint64
	// PromotionSteps counts promotions by the engine steps (step ends of
	// their region) from submission to outcome, in the buckets
	// PromotionStepBuckets and one past them; PromotionStepSum is their sum.
	PromotionSteps   []uint64
	PromotionStepSum uint64
}

// Stats describes every namespace, in no particular order.
func (s *Service) Stats(ctx context.Context) []NamespaceStats {
	s.mu.Lock()
	groups := make([]*group, 0, len(s.groups))
	for _, g := range s.groups {
		groups = append(groups, g)
	}
	s.mu.Unlock()
	out := make([]NamespaceStats, 0, len(groups))
	for _, g := range groups {
		reply := make(chan NamespaceStats, 1)
		if err := g.do(ctx, func() { reply <- g.stats() }); err != nil {
			continue
		}
		select {
		case st := <-reply:
			out = append(out, st)
		case <-ctx.Done():
			return out
		}
	}
	return out
}
