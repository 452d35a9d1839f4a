package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvtier/kvtier/confvalue"
)

// fuzzTier has a field of every kind a tier package decodes its
// type-specific keys into, so that FuzzParse also runs TierSpec.Decode.
type fuzzTier struct {
	Str    string             `yaml:"str"`
	Int    int                `yaml:"int"`
	Uint   uint32             `yaml:"uint"`
	Float  float64            `yaml:"float"`
	Bool   bool               `yaml:"bool"`
	List   []string           `yaml:"list"`
	Map    map[string]int     `yaml:"map"`
	Any    map[string]any     `yaml:"any"`
	Size   confvalue.ByteSize `yaml:"size"`
	Wait   confvalue.Duration `yaml:"wait"`
	Medium Medium             `yaml:"medium"`
	Nested struct{ A []int }  `yaml:"nested"`
}

// FuzzParse checks that no document makes the parser panic, that every
// error is an *Error that names a key path or a line (only YAML syntax
// errors, which have neither, are exempt), and that an accepted config
// holds the invariants its users rely on.
func FuzzParse(f *testing.F) {
	for _, name := range []string{"explain.yaml", "tiers.yaml"} {
		if b, err := os.ReadFile(filepath.Join("..", "examples", name)); err == nil {
			f.Add(b)
		}
	}
	for _, s := range []string{
		"",
		"namespace: {model: m, bytes_per_block: 1.5MiB}\nprimary: {bytes: 3MiB, policy: ARC}\n",
		"secondary_tiers:\n  - {name: a, type: memory, str: x, int: -1, uint: 7, list: [a, b], size: 4KiB, wait: 2s}\n  - {type: fs, map: {a: 1}, any: {x: [1, {y: 2}]}, nested: {a: [1, 2]}}\n",
		"secondary_tiers: [{type: memory}, {type: memory, name: memory0}]\n",
		"default_load_tiers: [{medium: storage}, {locality: GLOBAL}, 3]\ndefault_store_tiers: []\n",
		"validation: strict\nlimits: {max_key_bytes: 2048, max_wait: -1s}\nserver: {unix_socket: '', tcp_addr: ''}\n",
		"a: &a [1, 2]\nb: *a\nsecondary_tiers: [&t {type: memory}, *t]\n",
		"primary: {arena: {kind: file}}\nnamespace: {bytes_per_block: 99999999999999999999TiB}\n",
		"--- \nprimary: 1\n---\nprimary: 2\n",
		"[1, 2]\n",
		"? [a]\n: b\n",
		"secondary_tiers:\n  - type: memory\n    type: fs\n    name: ../x\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := Parse(data)
		if err != nil {
			checkErrors(t, data, err, "")
			return
		}
		if cfg.Namespace.BytesPerBlock <= 0 || cfg.Primary.Bytes < cfg.Namespace.BytesPerBlock || cfg.NumSlots() < 1 {
			t.Fatalf("accepted sizes that hold no block: %+v %+v", cfg.Namespace, cfg.Primary)
		}
		names := make(map[string]bool)
		for i, ts := range cfg.SecondaryTiers {
			if ts.Type == "" || ts.Name == "" || ts.Index != i || names[ts.Name] {
				t.Fatalf("tier %d accepted as name %q type %q index %d (names so far %v)", i, ts.Name, ts.Type, ts.Index, names)
			}
			names[ts.Name] = true
			var v fuzzTier
			if err := ts.Decode(&v); err != nil {
				checkErrors(t, data, err, ts.Path())
			}
		}
	})
}

// checkErrors fails t unless err is made of *Error values that name a
// path under prefix or a line.
func checkErrors(t *testing.T, data []byte, err error, prefix string) {
	t.Helper()
	errs := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	}
	if len(errs) == 0 || len(errs) > maxErrors {
		t.Fatalf("%d errors for %q", len(errs), data)
	}
	for _, e := range errs {
		var ce *Error
		if !errors.As(e, &ce) {
			t.Fatalf("error %v (%T) is not a *config.Error", e, e)
		}
		if ce.Msg == "" {
			t.Fatalf("empty message in %#v", ce)
		}
		if !strings.HasPrefix(ce.Path, prefix) {
			t.Fatalf("error %q is not under %q", ce, prefix)
		}
		if ce.Path == "" && ce.Line == 0 && !strings.HasPrefix(ce.Msg, "yaml: ") {
			t.Fatalf("error %q names neither a key nor a line (input %q)", ce, data)
		}
	}
}
