package cpu

import (
	"fmt"
	"strings"

	"github.com/kvtier/kvtier/cpu/arena"
)

// ArenaKind selects the slot arena's backing memory.
type ArenaKind string

// Arena kinds.
const (
	// ArenaAnonymous is private anonymous memory (the default).
	ArenaAnonymous ArenaKind = "anonymous"
	// ArenaFile is a shared file at ArenaConfig.Path, e.g. under /dev/shm,
	// created 0600 and removed by Close.
	ArenaFile ArenaKind = "file"
	// ArenaMemfd is a memfd, shareable through its file descriptor.
	ArenaMemfd ArenaKind = "memfd"
)

// ArenaConfig describes the slot arena's backing memory.
type ArenaConfig struct {
	Kind ArenaKind // "" means ArenaAnonymous
	Path string    // ArenaFile only
}

// Config configures a Primary.
type Config struct {
	SlotSize int    // bytes per slot (= bytes per block), > 0
	Capacity int64  // bytes; NumSlots = Capacity / SlotSize, at least 1
	Policy   string // "lru" (default when "") or "arc"
	Arena    ArenaConfig
	Events   bool // buffer offload.Event for TakeEvents

	// StoreThreshold ≥ 2 enables the reuse filter of a primary used
	// without secondary tiers (vLLM's store_threshold): PrepareStore
	// skips keys looked up fewer than StoreThreshold times. 0 or 1 is off.
	// ReuseTrackerSize bounds the keys whose lookups are counted (0 means
	// DefaultReuseTrackerSize).
	StoreThreshold   int
	ReuseTrackerSize int

	// Shares divide the primary between owners of key spaces (tenants;
	// see shares.go): each is guaranteed its quota of slots and has its
	// own eviction order. None: one order for every block.
	Shares []Share
}

// Policy names.
const (
	PolicyLRU = "lru"
	PolicyARC = "arc"
)

// numSlots validates cfg and returns the slot count. A remainder of
// Capacity that does not fill a whole slot is left unused.
func (cfg Config) numSlots() (int, error) {
	if cfg.SlotSize <= 0 {
		return 0, fmt.Errorf("cpu: slot size %d: want > 0", cfg.SlotSize)
	}
	if cfg.Capacity < int64(cfg.SlotSize) {
		return 0, fmt.Errorf("cpu: capacity %d bytes holds no slot of %d bytes", cfg.Capacity, cfg.SlotSize)
	}
	n := cfg.Capacity / int64(cfg.SlotSize)
	if n > arena.MaxSlots {
		return 0, fmt.Errorf("cpu: capacity %d bytes is %d slots of %d bytes; at most %d slots are supported", cfg.Capacity, n, cfg.SlotSize, arena.MaxSlots)
	}
	return int(n), nil
}

func (cfg Config) reuse() (threshold, size int, err error) {
	if cfg.StoreThreshold < 0 || cfg.ReuseTrackerSize < 0 {
		return 0, 0, fmt.Errorf("cpu: store threshold %d, reuse tracker size %d: want >= 0", cfg.StoreThreshold, cfg.ReuseTrackerSize)
	}
	if cfg.StoreThreshold < 2 {
		return 0, 0, nil
	}
	size = cfg.ReuseTrackerSize
	if size == 0 {
		size = DefaultReuseTrackerSize
	}
	if size > arena.MaxSlots {
		return 0, 0, fmt.Errorf("cpu: reuse tracker size %d: at most %d", size, arena.MaxSlots)
	}
	return cfg.StoreThreshold, size, nil
}

func (cfg Config) policy() (string, error) {
	switch p := strings.ToLower(cfg.Policy); p {
	case "", PolicyLRU:
		return PolicyLRU, nil
	case PolicyARC:
		return PolicyARC, nil
	}
	return "", fmt.Errorf("cpu: policy %q: want %s or %s", cfg.Policy, PolicyLRU, PolicyARC)
}

func (k ArenaKind) arenaKind() (arena.Kind, error) {
	switch strings.ToLower(string(k)) {
	case "", string(ArenaAnonymous):
		return arena.Anonymous, nil
	case string(ArenaFile):
		return arena.File, nil
	case string(ArenaMemfd):
		return arena.Memfd, nil
	}
	return "", fmt.Errorf("cpu: arena kind %q: want %s, %s or %s", string(k), ArenaAnonymous, ArenaFile, ArenaMemfd)
}
