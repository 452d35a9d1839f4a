package fs

import (
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/kvtier/kvtier/confvalue"
	"github.com/kvtier/kvtier/filemapper"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/quota"
	"github.com/kvtier/kvtier/vfs"
)

// Config configures an FS tier. The yaml tags are the keys of an fs entry
// under secondary_tiers; fields tagged "-" are set by the program.
type Config struct {
	// Name is the tier's name in the stack (the config entry's name).
	Name string `yaml:"-"`
	// RootDir is the directory under which the namespace directories live
	// (required). It is created if missing; an unwritable root is an error.
	RootDir string `yaml:"root_dir"`
	// Locality is "local" (the default) or "remote" (case-insensitive):
	// a directory on a network filesystem shared by several hosts is
	// remote.
	Locality string `yaml:"locality"`
	// ReadThreads and WriteThreads size the load and store worker pools
	// (default 8 each).
	ReadThreads  int `yaml:"read_threads"`
	WriteThreads int `yaml:"write_threads"`
	// QueueDepth bounds the jobs waiting for each pool (default 256). A
	// job submitted to a full queue fails at once and is counted.
	QueueDepth int `yaml:"queue_depth"`
	// MaxBytes bounds the bytes of block files (0 = unbounded), written as
	// everywhere in the config file ("500GiB"). Usage above
	// HighWatermark × MaxBytes (default 0.95) evicts least-recently-used
	// files down to LowWatermark × MaxBytes (default 0.85).
	MaxBytes      confvalue.ByteSize `yaml:"max_bytes"`
	HighWatermark float64            `yaml:"high_watermark"`
	LowWatermark  float64            `yaml:"low_watermark"`
	// Format is "kvtier" (default: trailer with checksum) or "vllm" (raw
	// vLLM layout, length check only).
	Format string `yaml:"format"`
	// Fsync is when block data is made durable before a file is renamed
	// into place: "none" (never: after a power loss a block may read back
	// as zeros or short), "block" (fsync each file before its rename) or
	// "batch" (one syncfs per store job, then the renames). The default is
	// "none" for format kvtier, whose checksum turns such a block into a
	// miss, and "block" for format vllm, which has no checksum.
	Fsync string `yaml:"fsync"`
	// ODirect is "auto" (default: use O_DIRECT when the probe succeeds),
	// "on" (fail start-up when it does not) or "off".
	ODirect string `yaml:"o_direct"`
	// Events turns on stored/removed events for this tier.
	Events bool `yaml:"events"`
	// StaleTmpAge is how old (by modification time) a leftover temp file
	// ("*.tmp") must be before the tier deletes it (default 10m). At start
	// the tier removes the stale ones and leaves younger ones alone: they
	// may belong to another process sharing the directory (vLLM, another
	// kvtier) that is writing them right now. It looks at those once more
	// when they could have become stale, so its own crash leftovers found
	// by a quick restart do not stay until the next one.
	StaleTmpAge confvalue.Duration `yaml:"stale_tmp_age"`
	// LookupBatch bounds the keys of one existence-check call (0 = the
	// whole step's batch at once).
	LookupBatch int `yaml:"lookup_batch"`
	// Namespace holds the digest fields (§5.1) and the rank.
	Namespace filemapper.Namespace `yaml:"namespace"`

	// GlobalEventsOff is set when KV events are disabled for the whole
	// daemon: a tier that opts in then logs a warning and stays silent.
	GlobalEventsOff bool `yaml:"-"`
	// FS is the filesystem (nil = the operating system's).
	FS vfs.FS `yaml:"-"`
	// Shares divide max_bytes between tenants (shares.go); set from the
	// daemon's tenants' quota.tiers, not from the tier's own entry.
	// Each share's Quota is in bytes.
	Shares []quota.Share `yaml:"-"`
	// Logger (nil = slog.Default()).
	Logger *slog.Logger `yaml:"-"`
}

// Defaults.
const (
	DefaultThreads       = 8
	DefaultQueueDepth    = 256
	DefaultHighWatermark = 0.95
	DefaultLowWatermark  = 0.85
	DefaultStaleTmpAge   = 10 * time.Minute
)

// fsyncMode is the parsed fsync setting.
type fsyncMode uint8

const (
	fsyncNone fsyncMode = iota
	fsyncBlock
	fsyncBatch
)

func (m fsyncMode) String() string {
	return [...]string{"none", "block", "batch"}[m]
}

// oDirectMode is the parsed o_direct setting.
type oDirectMode uint8

const (
	directAuto oDirectMode = iota
	directOn
	directOff
)

// settings is a validated Config.
type settings struct {
	name          string
	root          string
	locality      offload.Locality
	readThreads   int
	writeThreads  int
	queueDepth    int
	maxBytes      int64
	high, low     int64 // watermarks in bytes (0 when unbounded)
	format        Format
	fsync         fsyncMode
	direct        oDirectMode
	events        bool
	eventsIgnored bool // opted in with events disabled globally
	lookupBatch   int
	staleTmpAge   time.Duration
	ns            filemapper.Namespace
	fs            vfs.FS
	logger        *slog.Logger
}

// ParseLocality maps a configured locality (confvalue.ParseLocality),
// local when none is given: an fs tier is a directory of this host unless
// the configuration says it is shared, and a request that asks for remote
// tiers only must not load from the local disk.
func ParseLocality(s string) (offload.Locality, error) {
	l, err := confvalue.ParseLocality(s)
	if err != nil {
		return 0, fmt.Errorf("locality: %w", err)
	}
	if l == offload.LocalityUnspecified {
		l = offload.LocalityLocal
	}
	return l, nil
}

func (c Config) settings() (settings, error) {
	s := settings{name: c.Name, root: c.RootDir, events: c.Events, lookupBatch: c.LookupBatch, fs: c.FS, logger: c.Logger}
	if s.name == "" {
		s.name = "fs"
	}
	if s.root == "" {
		return s, fmt.Errorf("root_dir is required")
	}
	var err error
	if s.locality, err = ParseLocality(c.Locality); err != nil {
		return s, err
	}
	if s.format, err = ParseFormat(c.Format); err != nil {
		return s, err
	}
	switch strings.ToLower(c.Fsync) {
	case "":
		if s.format == FormatVLLM {
			s.fsync = fsyncBlock
		}
	case "none", "off":
		s.fsync = fsyncNone
	case "block":
		s.fsync = fsyncBlock
	case "batch":
		s.fsync = fsyncBatch
	default:
		return s, fmt.Errorf("fsync %q: want none, block or batch", c.Fsync)
	}
	switch strings.ToLower(c.ODirect) {
	case "", "auto":
		s.direct = directAuto
	case "on", "true":
		s.direct = directOn
	case "off", "false":
		s.direct = directOff
	default:
		return s, fmt.Errorf("o_direct %q: want auto, on or off", c.ODirect)
	}
	pos := func(key string, v, def int) (int, error) {
		switch {
		case v == 0:
			return def, nil
		case v < 0 || v > 4096:
			return 0, fmt.Errorf("%s %d: want 1..4096", key, v)
		}
		return v, nil
	}
	if s.readThreads, err = pos("read_threads", c.ReadThreads, DefaultThreads); err != nil {
		return s, err
	}
	if s.writeThreads, err = pos("write_threads", c.WriteThreads, DefaultThreads); err != nil {
		return s, err
	}
	if c.QueueDepth < 0 || c.QueueDepth > 1<<20 {
		return s, fmt.Errorf("queue_depth %d: want 1..%d", c.QueueDepth, 1<<20)
	}
	s.queueDepth = c.QueueDepth
	if s.queueDepth == 0 {
		s.queueDepth = DefaultQueueDepth
	}
	switch s.staleTmpAge = c.StaleTmpAge.Value(); {
	case s.staleTmpAge < 0:
		return s, fmt.Errorf("stale_tmp_age %v is negative", s.staleTmpAge)
	case s.staleTmpAge == 0:
		s.staleTmpAge = DefaultStaleTmpAge
	}
	if c.LookupBatch < 0 {
		return s, fmt.Errorf("lookup_batch %d is negative", c.LookupBatch)
	}
	if c.MaxBytes < 0 {
		return s, fmt.Errorf("max_bytes %d is negative", c.MaxBytes)
	}
	s.maxBytes = int64(c.MaxBytes)
	high, low := c.HighWatermark, c.LowWatermark
	if high == 0 {
		high = DefaultHighWatermark
	}
	if low == 0 {
		low = DefaultLowWatermark
	}
	if !(high > 0 && high <= 1) {
		return s, fmt.Errorf("high_watermark %v: want 0 < high ≤ 1", c.HighWatermark)
	}
	if !(low > 0 && low <= high) {
		return s, fmt.Errorf("low_watermark %v: want 0 < low ≤ high_watermark (%v)", low, high)
	}
	if s.maxBytes > 0 {
		s.high = int64(float64(s.maxBytes) * high)
		s.low = int64(float64(s.maxBytes) * low)
	}
	s.ns = c.Namespace.WithDefaults()
	if err := s.ns.Validate(); err != nil {
		return s, err
	}
	if s.fs == nil {
		s.fs = vfs.OS()
	}
	if s.logger == nil {
		s.logger = slog.Default()
	}
	s.logger = s.logger.With("tier", s.name, "type", "fs")
	if s.events && c.GlobalEventsOff {
		s.events, s.eventsIgnored = false, true
	}
	return s, nil
}
