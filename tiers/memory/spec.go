package memory

import (
	"fmt"
	"strings"
	"time"

	"github.com/kvtier/kvtier/offload"
)

// Spec is the type-specific part of a memory tier's entry in the config
// file (`secondary_tiers: [{name: m, type: memory, ...}]`), decoded
// strictly by the config package. Values are strings where the file
// spells them as words, so that case and errors are handled here.
type Spec struct {
	Medium         string  `yaml:"medium"`   // cpu | storage; absent = dynamic
	Locality       string  `yaml:"locality"` // local | remote (global); absent = dynamic
	CapacityBlocks int     `yaml:"capacity_blocks"`
	Latency        string  `yaml:"latency"` // Go duration, e.g. 5ms
	FailRate       float64 `yaml:"fail_rate"`
	AsyncLookup    bool    `yaml:"async_lookup"`
	Events         bool    `yaml:"events"`
	Seed           int64   `yaml:"seed"`
}

// Config validates s and returns the Config of the tier called name.
// Errors name the offending key and value.
func (s Spec) Config(name string) (Config, error) {
	cfg := Config{
		Name:           name,
		CapacityBlocks: s.CapacityBlocks,
		FailRate:       s.FailRate,
		AsyncLookup:    s.AsyncLookup,
		Events:         s.Events,
		Seed:           s.Seed,
	}
	if s.Medium != "" {
		m, ok := offload.ParseMedium(s.Medium)
		if !ok {
			return Config{}, fmt.Errorf("memory tier %q: medium %q: want cpu or storage", name, s.Medium)
		}
		cfg.Medium = m
	}
	if s.Locality != "" {
		l, ok := offload.ParseLocality(s.Locality)
		if !ok {
			return Config{}, fmt.Errorf("memory tier %q: locality %q: want local or remote", name, s.Locality)
		}
		cfg.Locality = l
	}
	if s.Latency != "" {
		d, err := time.ParseDuration(strings.ToLower(s.Latency))
		if err != nil || d < 0 {
			return Config{}, fmt.Errorf("memory tier %q: latency %q: want a non-negative Go duration such as 5ms", name, s.Latency)
		}
		cfg.Latency = d
	}
	if s.CapacityBlocks < 0 {
		return Config{}, fmt.Errorf("memory tier %q: capacity_blocks %d: must be >= 0", name, s.CapacityBlocks)
	}
	if !(s.FailRate >= 0 && s.FailRate <= 1) {
		return Config{}, fmt.Errorf("memory tier %q: fail_rate %v: must be in [0, 1]", name, s.FailRate)
	}
	return cfg, nil
}
