package tierset

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/kvtier/kvtier/config"
	"github.com/kvtier/kvtier/confvalue"
	"github.com/kvtier/kvtier/explain"
	"github.com/kvtier/kvtier/keyspace"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/quota"
	"github.com/kvtier/kvtier/tiers/fs"
	"github.com/kvtier/kvtier/tiers/memory"
	"github.com/kvtier/kvtier/tiers/peer"
	"github.com/kvtier/kvtier/tiers/redis"
	"github.com/kvtier/kvtier/tiers/s3"
	"github.com/kvtier/kvtier/vfs"
)

// Options carries what built tiers get from their surroundings.
type Options struct {
	// Logger receives the tiers' logs; nil means slog.Default().
	Logger *slog.Logger
	// FS, if set, gives the filesystem of each fs tier by name (fault
	// injection in tests and tools: vfstest.Injector); nil means the
	// operating system's.
	FS func(tier string) vfs.FS
}

// plan is a decoded and validated tier entry, ready to build.
type plan struct {
	decl    explain.Declaration
	details explain.Details
	build   func(ctx context.Context, opts Options) (offload.SecondaryTier, error)
}

// tierTypes lists the supported types, sorted by name. Each entry decodes
// and validates a TierSpec of its type without side effects.
var tierTypes = []struct {
	name string
	plan func(spec config.TierSpec, cfg *config.Config) (plan, error)
	// events: the type publishes KV events of its own (an "events" key).
	// A peer tier has none: its peers publish theirs.
	events bool
}{
	{fsType, planFS, true},
	{memory.Type, planMemory, true},
	{peer.Type, planPeer, false},
	{redis.Type, planRedis, true},
	{s3.Type, planS3, true},
}

// Types returns the supported tier types, sorted.
func Types() []string {
	out := make([]string, len(tierTypes))
	for i, t := range tierTypes {
		out[i] = t.name
	}
	return out
}

func planTiers(cfg *config.Config) ([]plan, error) {
	plans := make([]plan, 0, len(cfg.SecondaryTiers))
	var errs []error
	for _, spec := range cfg.SecondaryTiers {
		p, err := planTier(spec, cfg)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		plans = append(plans, p)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return plans, nil
}

func planTier(spec config.TierSpec, cfg *config.Config) (plan, error) {
	for _, t := range tierTypes {
		if t.name == spec.Type {
			// A tier emits events when the daemon does, unless its
			// entry says otherwise.
			if t.events && cfg.Events.Enabled && !spec.Has("events") {
				spec = spec.With("events", "true")
			}
			return t.plan(spec, cfg)
		}
	}
	return plan{}, spec.Errorf("type", "unknown tier type %q (supported: %s)", spec.Type, strings.Join(Types(), ", "))
}

// DeclareDetails returns, by tier name, the explain.Details of the config's tiers
// that have any, for explain.Explanation.AddDetails.
func DeclareDetails(cfg *config.Config) (map[string]explain.Details, error) {
	plans, err := planTiers(cfg)
	if err != nil {
		return nil, err
	}
	out := map[string]explain.Details{}
	for _, p := range plans {
		if len(p.details.Parts) > 0 || p.details.ReadOnly {
			out[p.decl.Name] = p.details
		}
	}
	return out, nil
}

// Declare decodes and validates every secondary tier of cfg and returns
// their declarations in config order, without building anything. Errors
// (joined, one per problem) name the key path.
func Declare(cfg *config.Config) ([]explain.Declaration, error) {
	plans, err := planTiers(cfg)
	if err != nil {
		return nil, err
	}
	decls := make([]explain.Declaration, len(plans))
	for i, p := range plans {
		decls[i] = p.decl
	}
	return decls, nil
}

// Build builds the secondary tiers of cfg in config order (lookup
// priority). If one fails, the tiers already built are closed and the
// error names the failing entry.
func Build(ctx context.Context, cfg *config.Config, opts Options) ([]offload.SecondaryTier, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	plans, err := planTiers(cfg)
	if err != nil {
		return nil, err
	}
	return buildPlans(ctx, cfg.SecondaryTiers, plans, opts)
}

// buildPlans builds plans[i] (from specs[i]) in order, closing what it
// built when one fails.
func buildPlans(ctx context.Context, specs []config.TierSpec, plans []plan, opts Options) ([]offload.SecondaryTier, error) {
	tiers := make([]offload.SecondaryTier, 0, len(plans))
	for i, p := range plans {
		t, err := p.build(ctx, opts)
		if err == nil && explain.DeclarationOf(t) != p.decl {
			err = fmt.Errorf("built tier declares %s, config declares %s", explain.DeclarationOf(t), p.decl)
			err = errors.Join(err, t.Close(ctx))
		}
		if err != nil {
			err = fmt.Errorf("%s (%s): %w", specs[i].Path(), p.decl.Name, err)
			return nil, errors.Join(err, closeAll(ctx, tiers))
		}
		tiers = append(tiers, t)
	}
	return tiers, nil
}

// closeAll closes tiers in reverse order of construction.
func closeAll(ctx context.Context, tiers []offload.SecondaryTier) error {
	var errs []error
	for i := len(tiers) - 1; i >= 0; i-- {
		if err := tiers[i].Close(ctx); err != nil {
			errs = append(errs, fmt.Errorf("close tier %s: %w", tiers[i].Name(), err))
		}
	}
	return errors.Join(errs...)
}

// memorySpec is the type-specific part of a memory tier entry. config's
// value types give case-insensitive values and errors that name the key.
type memorySpec struct {
	Medium         config.Medium      `yaml:"medium"`
	Locality       config.Locality    `yaml:"locality"`
	CapacityBlocks int                `yaml:"capacity_blocks"`
	Latency        confvalue.Duration `yaml:"latency"`
	BlockLatency   confvalue.Duration `yaml:"block_latency"`
	Concurrency    int                `yaml:"concurrency"`
	QueueDepth     int                `yaml:"queue_depth"`
	FailRate       float64            `yaml:"fail_rate"`
	AsyncLookup    bool               `yaml:"async_lookup"`
	Events         bool               `yaml:"events"`
	Seed           int64              `yaml:"seed"`
}

func planMemory(spec config.TierSpec, cfg *config.Config) (plan, error) {
	var s memorySpec
	if err := spec.Decode(&s); err != nil {
		return plan{}, err
	}
	var errs []error
	if s.CapacityBlocks < 0 {
		errs = append(errs, spec.Errorf("capacity_blocks", "must not be negative, got %d", s.CapacityBlocks))
	}
	if s.Concurrency < 0 {
		errs = append(errs, spec.Errorf("concurrency", "must not be negative, got %d", s.Concurrency))
	}
	if s.QueueDepth < 0 {
		errs = append(errs, spec.Errorf("queue_depth", "must not be negative, got %d", s.QueueDepth))
	}
	if !(s.FailRate >= 0 && s.FailRate <= 1) { // also rejects NaN
		errs = append(errs, spec.Errorf("fail_rate", "must be in [0, 1], got %v", s.FailRate))
	}
	if err := errors.Join(errs...); err != nil {
		return plan{}, err
	}
	mc := memory.Config{
		Name:           spec.Name,
		Medium:         s.Medium.Value(),
		Locality:       s.Locality.Value(),
		CapacityBlocks: s.CapacityBlocks,
		Latency:        s.Latency.Value(),
		BlockLatency:   s.BlockLatency.Value(),
		Concurrency:    s.Concurrency,
		QueueDepth:     s.QueueDepth,
		FailRate:       s.FailRate,
		AsyncLookup:    s.AsyncLookup,
		Events:         s.Events,
		Seed:           s.Seed,
	}
	mc.BlockBytes, _ = cfg.Namespace.BytesPerBlock.Int()
	var err error
	if mc.Shares, err = tierShares(cfg, spec.Name); err != nil {
		return plan{}, err
	}
	return plan{
		decl: explain.Declaration{Name: mc.Name, Type: memory.Type, Medium: mc.Medium, Locality: mc.Locality},
		build: func(context.Context, Options) (offload.SecondaryTier, error) {
			t, err := memory.New(mc)
			if err != nil {
				return nil, err // not a typed nil in the interface
			}
			return t, nil
		},
	}, nil
}

// fsType is the configured type of filesystem tiers.
const fsType = "fs"

// FSTiers returns the configuration of every fs tier of cfg, in config
// order, as Build would pass it to fs.New (without a logger or FS): tools
// such as kvtier fsck work on a tier's directory without building it.
func FSTiers(cfg *config.Config) ([]fs.Config, error) {
	var out []fs.Config
	var errs []error
	for _, spec := range cfg.SecondaryTiers {
		if spec.Type != fsType {
			continue
		}
		fc, err := fsConfig(spec, cfg)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, fc)
	}
	return out, errors.Join(errs...)
}

// fsConfig decodes an fs entry: its keys are fs.Config's yaml keys. The
// namespace fills the layout fields the entry leaves unset, and the
// daemon-wide events switch gates the tier's events.
func fsConfig(spec config.TierSpec, cfg *config.Config) (fs.Config, error) {
	var fc fs.Config
	if err := spec.Decode(&fc); err != nil {
		return fc, err
	}
	var errs []error
	if fc.RootDir == "" {
		errs = append(errs, spec.Errorf("root_dir", "required (the directory that holds the tier's blocks)"))
	}
	if _, err := fs.ParseLocality(fc.Locality); err != nil {
		errs = append(errs, spec.Errorf("locality", "invalid value %q (want local or remote)", fc.Locality))
	}
	if err := errors.Join(errs...); err != nil {
		return fc, err
	}
	fc.Name = spec.Name
	if fc.Namespace.ModelName == "" {
		fc.Namespace.ModelName = cfg.Namespace.Model
	}
	if fc.Namespace.BlockBytes == 0 {
		fc.Namespace.BlockBytes, _ = cfg.Namespace.BytesPerBlock.Int()
	}
	fc.GlobalEventsOff = !cfg.Events.Enabled
	var err error
	fc.Shares, err = tierShares(cfg, spec.Name)
	return fc, err
}

// tierShares returns the tenants' and shared spaces' quotas of tier name
// (in bytes), each under the ID of its key space.
func tierShares(cfg *config.Config, name string) ([]quota.Share, error) {
	var out []quota.Share
	for _, s := range cfg.TierShares(name) {
		space, err := keyspace.Tenant(s.Name)
		if s.Shared {
			space, err = keyspace.Shared(s.Name)
		}
		if err != nil {
			return nil, err
		}
		out = append(out, quota.Share{Space: space.ID(), Quota: int64(s.Bytes), Weight: s.Weight})
	}
	return out, nil
}

// planFS plans an fs entry (fsConfig). Settings only fs.New can judge
// (format, fsync, o_direct, thread counts) are checked by Build.
func planFS(spec config.TierSpec, cfg *config.Config) (plan, error) {
	fc, err := fsConfig(spec, cfg)
	if err != nil {
		return plan{}, err
	}
	loc, _ := fs.ParseLocality(fc.Locality)
	return plan{
		decl: explain.Declaration{Name: spec.Name, Type: fsType, Medium: offload.MediumStorage, Locality: loc},
		build: func(_ context.Context, opts Options) (offload.SecondaryTier, error) {
			c := fc
			c.Logger = opts.Logger.With("tier", c.Name)
			if opts.FS != nil {
				c.FS = opts.FS(c.Name)
			}
			t, err := fs.New(c)
			if err != nil {
				return nil, err
			}
			return t, nil
		},
	}, nil
}
