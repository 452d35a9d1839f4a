package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"regexp"
	"strconv"

	"go.yaml.in/yaml/v3"

	"github.com/kvtier/kvtier/confvalue"
	"github.com/kvtier/kvtier/offload"
)

// Config is a kvtier configuration. Load and Parse return it with every
// default applied and every generic rule checked.
type Config struct {
	// File is the path the config was loaded from ("" for Parse).
	File string `yaml:"-"`

	Namespace Namespace `yaml:"namespace"`
	Primary   Primary   `yaml:"primary"`
	// SecondaryTiers in config order, which is lookup priority.
	SecondaryTiers []TierSpec `yaml:"secondary_tiers"`
	// DefaultLoadTiers and DefaultStoreTiers apply to requests that omit
	// kv_load_tiers / kv_store_tiers or send null (docs/design.md §3).
	DefaultLoadTiers  Filter `yaml:"default_load_tiers"`
	DefaultStoreTiers Filter `yaml:"default_store_tiers"`
	// Validation is what happens to a request whose filter has an invalid
	// part: lenient (warn, skip, fail open) or strict (reject).
	Validation Validation `yaml:"validation"`

	// Daemon sections (kvtier serve), see daemon.go.
	Server Server `yaml:"server"`
	Limits Limits `yaml:"limits"`
	Events Events `yaml:"events"`
	// Engines configures vLLM manager mode.
	Engines Engines `yaml:"engines"`
	// Cascades bounds and paces the cascades from the primary to the
	// secondary tiers, in every namespace.
	Cascades Cascades `yaml:"cascades"`
	// Regions configures vLLM tier mode's registered regions.
	Regions Regions `yaml:"regions"`
	// Prefetch bounds routers' and agents' prefetches, Pins their pins,
	// in every namespace with a primary.
	Prefetch Prefetch `yaml:"prefetch"`
	Pins     Pins     `yaml:"pins"`
	// Tenants and SharedSpaces divide the daemon between customers
	// (tenants.go).
	Tenants      []Tenant      `yaml:"tenants"`
	SharedSpaces []SharedSpace `yaml:"shared_spaces"`
}

// Namespace describes the blocks kvtier stores.
type Namespace struct {
	// Model names the model whose KV blocks these are (default "default");
	// storage tiers use it in their layout so that models never share
	// blocks.
	Model string `yaml:"model"`
	// BytesPerBlock is the size of one offloaded block, which is the
	// primary tier's slot size (default 2MiB).
	BytesPerBlock confvalue.ByteSize `yaml:"bytes_per_block"`
}

// Primary configures the CPU primary tier.
type Primary struct {
	// Bytes is the capacity (default 1GiB); slots = Bytes / BytesPerBlock.
	// 0 runs no primary: the daemon then serves only engines that bring
	// their own CPU cache (vLLM tier mode).
	Bytes confvalue.ByteSize `yaml:"bytes"`
	// Policy is the eviction policy (default lru).
	Policy Policy `yaml:"policy"`
	Arena  Arena  `yaml:"arena"`
}

// Arena configures the primary tier's slot memory.
type Arena struct {
	// Kind is anonymous (default), file or memfd.
	Kind ArenaKind `yaml:"kind"`
	// Path is the shared file of kind file, e.g. /dev/shm/kvtier.arena.
	Path string `yaml:"path"`
}

// Defaults.
const (
	DefaultModel         = "default"
	DefaultBytesPerBlock = 2 * confvalue.MiB
	DefaultPrimaryBytes  = 1 * confvalue.GiB
)

// Default returns the configuration of an empty file: a 1 GiB LRU primary
// on anonymous memory, 2 MiB blocks, no secondary tiers, lenient
// validation and no default filters.
func Default() *Config {
	return &Config{
		Namespace: Namespace{Model: DefaultModel, BytesPerBlock: DefaultBytesPerBlock},
		Primary:   Primary{Bytes: DefaultPrimaryBytes, Policy: PolicyLRU, Arena: Arena{Kind: ArenaAnonymous}},
		Server:    defaultServer(),
	}
}

// Load reads and parses the config file at path. Errors name the file,
// the line and the key path.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return parse(data, path)
}

// Parse parses a config document. Errors are *Error values (joined when
// there are several) naming the key path.
func Parse(data []byte) (*Config, error) { return parse(data, "") }

func parse(data []byte, file string) (*Config, error) {
	cfg := Default()
	cfg.File = file
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil && !errors.Is(err, io.EOF) {
		return nil, &Error{File: file, Msg: err.Error()}
	}
	// A syntax error after the first document is reported as such, not as
	// a second document, so that the message says what and where.
	var extra yaml.Node
	switch err := dec.Decode(&extra); {
	case errors.Is(err, io.EOF):
	case err != nil:
		return nil, &Error{File: file, Msg: err.Error()}
	default:
		return nil, &Error{File: file, Line: extra.Line, Msg: "want one YAML document, found more"}
	}
	d := &decoder{file: file}
	n := resolve(&doc)
	if isNull(n) && file != "" {
		// An empty file would run on the built-in defaults (no secondary
		// tier), which is not the embedded default config either: most
		// likely a file written by mistake or a template that rendered
		// nothing.
		return nil, &Error{File: file, Msg: "the file has no keys (empty, or only comments); put the settings you want in it " +
			"(`kvtier serve --print-default-config` prints a commented config to start from), or leave out --config " +
			"to run the embedded default"}
	}
	if !isNull(n) {
		d.decodeStruct(n, "", reflect.ValueOf(cfg).Elem(), nil)
	}
	if len(d.errs) == 0 {
		cfg.check(d)
	}
	if err := d.err(); err != nil {
		return nil, err
	}
	return cfg, nil
}

// tierNameRE keeps names usable in metric labels, log lines and paths.
var tierNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)

// check applies the rules that span several keys, and fills in tier names.
func (c *Config) check(d *decoder) {
	if c.Namespace.BytesPerBlock <= 0 {
		d.errorf(nil, "namespace.bytes_per_block", "must be positive, got %d", c.Namespace.BytesPerBlock)
	} else if _, ok := c.Namespace.BytesPerBlock.Int(); !ok {
		d.errorf(nil, "namespace.bytes_per_block", "%s is too large", c.Namespace.BytesPerBlock)
	} else if c.Primary.Bytes < 0 || (c.Primary.Bytes > 0 && c.Primary.Bytes < c.Namespace.BytesPerBlock) {
		d.errorf(nil, "primary.bytes", "%s holds no block of namespace.bytes_per_block = %s (0 runs no primary: vLLM tier mode only)",
			c.Primary.Bytes, c.Namespace.BytesPerBlock)
	}
	if c.Engines.PrimaryBytes < 0 {
		d.errorf(nil, "engines.primary_bytes", "must not be negative, got %d", c.Engines.PrimaryBytes)
	}
	if c.Engines.MaxNamespaces < 0 {
		d.errorf(nil, "engines.max_namespaces", "must not be negative, got %d", c.Engines.MaxNamespaces)
	}
	switch a := c.Primary.Arena; {
	case a.Kind == ArenaFile && a.Path == "":
		d.errorf(nil, "primary.arena.path", "required when primary.arena.kind is file")
	case a.Kind != ArenaFile && a.Path != "":
		d.errorf(nil, "primary.arena.path", "only used when primary.arena.kind is file (kind is %s)", a.Kind)
	}

	c.checkDaemon(d)
	c.checkCascades(d)
	c.checkPrefetch(d)
	c.checkPins(d)
	defer c.checkTenants(d) // after the tiers have their names

	byName := make(map[string]int, len(c.SecondaryTiers))
	for i := range c.SecondaryTiers {
		t := &c.SecondaryTiers[i]
		t.Index = i
		if t.Name == "" {
			t.Name = t.Type + strconv.Itoa(i)
		} else if !tierNameRE.MatchString(t.Name) {
			d.errorAt(t.nameLine, t.path+".name",
				"invalid name %q (want 1-64 letters, digits, '_', '.' or '-', starting with a letter or digit)", t.Name)
			continue
		}
		if j, dup := byName[t.Name]; dup {
			d.errorAt(max(t.nameLine, t.line), t.path+".name", "duplicate name %q (also secondary_tiers[%d])", t.Name, j)
			continue
		}
		byName[t.Name] = i
	}
}

// Parser returns a request parser with the config's default filters and
// validation mode.
func (c *Config) Parser() *offload.Parser {
	return &offload.Parser{
		DefaultLoad:  c.DefaultLoadTiers.TierFilter(),
		DefaultStore: c.DefaultStoreTiers.TierFilter(),
		Mode:         c.Validation.Mode(),
	}
}

// HasPrimary reports whether the daemon runs a primary tier (Primary.Bytes
// is not 0).
func (c *Config) HasPrimary() bool { return c.Primary.Bytes > 0 }

// NumSlots is the number of primary slots: Primary.Bytes / BytesPerBlock.
func (c *Config) NumSlots() int64 {
	if c.Namespace.BytesPerBlock <= 0 {
		return 0
	}
	return int64(c.Primary.Bytes / c.Namespace.BytesPerBlock)
}
