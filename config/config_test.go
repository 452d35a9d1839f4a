package config

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kvtier/kvtier/confvalue"
	"github.com/kvtier/kvtier/offload"
)

func TestParseDefaults(t *testing.T) {
	for _, doc := range []string{"", "# nothing\n", "---\n", "primary: ~\nnamespace:\n"} {
		cfg, err := Parse([]byte(doc))
		if err != nil {
			t.Fatalf("Parse(%q): %v", doc, err)
		}
		if cfg.Namespace.BytesPerBlock != 2*confvalue.MiB || cfg.Primary.Bytes != confvalue.GiB ||
			cfg.Primary.Policy != PolicyLRU || cfg.Primary.Arena.Kind != ArenaAnonymous ||
			cfg.Namespace.Model != DefaultModel || cfg.Validation.Mode() != offload.Lenient ||
			len(cfg.SecondaryTiers) != 0 || cfg.DefaultLoadTiers.IsSet() || cfg.DefaultStoreTiers.IsSet() {
			t.Errorf("Parse(%q) = %+v, want defaults", doc, cfg)
		}
		if got := cfg.NumSlots(); got != 512 {
			t.Errorf("NumSlots = %d, want 512", got)
		}
	}
}

func TestParseFull(t *testing.T) {
	doc := `
namespace:
  model: llama-3-8b
  bytes_per_block: 1.5 MiB
primary:
  bytes: 3MiB
  policy: ARC
  arena: {kind: File, path: /dev/shm/kvtier.arena}
secondary_tiers:
  - type: memory
    medium: storage
  - name: remote-cpu
    type: Memory
    medium: CPU
    locality: remote
default_load_tiers: []
default_store_tiers: [{medium: storage}, {locality: GLOBAL}]
validation: Strict
`
	cfg, err := Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Namespace.Model != "llama-3-8b" || cfg.Namespace.BytesPerBlock != 3*confvalue.MiB/2 {
		t.Errorf("namespace = %+v", cfg.Namespace)
	}
	if cfg.Primary.Bytes != 3*confvalue.MiB || cfg.Primary.Policy != PolicyARC ||
		cfg.Primary.Arena != (Arena{Kind: ArenaFile, Path: "/dev/shm/kvtier.arena"}) {
		t.Errorf("primary = %+v", cfg.Primary)
	}
	if cfg.NumSlots() != 2 {
		t.Errorf("NumSlots = %d, want 2", cfg.NumSlots())
	}
	if len(cfg.SecondaryTiers) != 2 {
		t.Fatalf("tiers = %+v", cfg.SecondaryTiers)
	}
	for i, want := range []struct{ name, typ, path string }{
		{"memory0", "memory", "secondary_tiers[0]"},
		{"remote-cpu", "memory", "secondary_tiers[1]"},
	} {
		got := cfg.SecondaryTiers[i]
		if got.Name != want.name || got.Type != want.typ || got.Index != i || got.Path() != want.path {
			t.Errorf("tier %d = %q %q %d %q, want %+v", i, got.Name, got.Type, got.Index, got.Path(), want)
		}
	}
	if !cfg.SecondaryTiers[1].Has("locality") || cfg.SecondaryTiers[1].Has("name") || cfg.SecondaryTiers[0].Has("locality") {
		t.Error("Has reports the wrong type-specific keys")
	}
	p := cfg.Parser()
	if p.Mode != offload.Strict {
		t.Errorf("mode = %v, want strict", p.Mode)
	}
	if !p.DefaultLoad.DeniesAll() || p.DefaultLoad.IsAll() {
		t.Errorf("default load = %v, want []", p.DefaultLoad)
	}
	wantStore := offload.NewTierFilter(offload.TierMatcher{Medium: offload.MediumStorage}, offload.TierMatcher{Locality: offload.LocalityRemote})
	if !p.DefaultStore.Equal(wantStore) {
		t.Errorf("default store = %v, want %v", p.DefaultStore, wantStore)
	}
	rc, err := p.NewReqContext("r", `{}`)
	if err != nil {
		t.Fatal(err)
	}
	if rc.LoadFromRequest || !rc.LoadFilter.DeniesAll() || !rc.StoreFilter.Equal(wantStore) {
		t.Errorf("request without filters got load %v store %v", rc.LoadFilter, rc.StoreFilter)
	}
}

// TestParseEvents checks the events keys that configure the publisher's
// endpoint mode and the media's wire names.
func TestParseEvents(t *testing.T) {
	for _, tc := range []struct {
		doc   string
		mode  EventsMode
		names MediumNames
	}{
		{"events: {enabled: true}\n", "", MediumNames{}},
		{"events: {mode: Bind, medium_names: {storage: DISK}}\n", EventsBind, MediumNames{Storage: "DISK"}},
		{"events: {mode: connect, medium_names: {CPU: dram, Storage: ssd}}\n", EventsConnect, MediumNames{CPU: "dram", Storage: "ssd"}},
		{"events: {medium_names: ~}\n", "", MediumNames{}},
	} {
		cfg, err := Parse([]byte(tc.doc))
		if err != nil {
			t.Fatalf("Parse(%q): %v", tc.doc, err)
		}
		if cfg.Events.Mode != tc.mode || cfg.Events.MediumNames != tc.names {
			t.Errorf("Parse(%q): mode %q names %+v, want %q %+v", tc.doc, cfg.Events.Mode, cfg.Events.MediumNames, tc.mode, tc.names)
		}
	}
}

// TestParseErrors checks that every error names the key path (and value)
// it is about.
func TestParseErrors(t *testing.T) {
	cases := []struct {
		name string
		doc  string
		want []string // substrings of the error, in order of appearance
	}{
		{"unknown top-level key", "colour: red\n",
			[]string{`colour: unknown key (want one of: namespace, primary, secondary_tiers, default_load_tiers, default_store_tiers, validation, server, limits, events, engines, cascades, regions, prefetch, pins, tenants, shared_spaces)`}},
		{"unknown daemon key", "events: {enable: true}\n",
			[]string{`events.enable: unknown key`}},
		{"unknown event medium", "events:\n  medium_names: {cpu: DRAM, gpu: HBM}\n",
			[]string{`events.medium_names.gpu: unknown medium (want cpu or storage)`}},
		{"empty event medium name", "events: {medium_names: {storage: \"\"}}\n",
			[]string{`events.medium_names.storage: want the medium's name on the wire, a non-empty string such as DISK, got ""`}},
		{"null event medium name", "events: {medium_names: {storage: ~}}\n",
			[]string{`events.medium_names.storage: want the medium's name on the wire, a non-empty string such as DISK, got nothing`}},
		{"event medium name not a string", "events: {medium_names: {cpu: [a]}}\n",
			[]string{`events.medium_names.cpu: want the medium's name on the wire, a non-empty string such as DISK, got a list`}},
		{"event medium named twice", "events:\n  medium_names:\n    cpu: A\n    CPU: B\n",
			[]string{`events.medium_names.CPU: duplicate medium (first set on line 3)`}},
		{"event medium names not a mapping", "events: {medium_names: [cpu]}\n",
			[]string{`events.medium_names: want a mapping such as {storage: DISK}, got a list`}},
		{"bad events mode", "events: {mode: listen}\n",
			[]string{`events.mode: invalid value "listen" (want bind or connect)`}},
		{"unreachable API", "server: {unix_socket: \"\", tcp_addr: \"\"}\n",
			[]string{`server: neither unix_socket nor tcp_addr is set`}},
		{"certificate without client CA", "tenants: [{name: acme, token: 0123456789abcdef, namespaces: [default], client_cert_cn: acme}]\n",
			[]string{`tenants[0].client_cert_cn: needs server.tls.client_ca_file`}},
		{"tenant events without events", "tenants: [{name: acme, token: 0123456789abcdef, namespaces: [default], events: {endpoint: \"tcp://127.0.0.1:5600\"}}]\n",
			[]string{`tenants[0].events: needs events.enabled`}},
		{"tenant events on the shared endpoint", "events: {enabled: true, endpoint: \"tcp://127.0.0.1:5600\"}\ntenants: [{name: acme, token: 0123456789abcdef, namespaces: [default], events: {endpoint: \"tcp://127.0.0.1:5600\"}}]\n",
			[]string{`tenants[0].events: endpoint "tcp://127.0.0.1:5600" is also events's`}},
		{"tenant events without an endpoint", "events: {enabled: true}\ntenants: [{name: acme, token: 0123456789abcdef, namespaces: [default], events: {topic: acme}}]\n",
			[]string{`tenants[0].events.endpoint: required`}},
		{"unix peers without tokens", "server: {unix_peers: [{uid: 0, as: admin}]}\n",
			[]string{`server.unix_peers: set without server.auth_token or tenants`}},
		{"unix peer without uid", "server: {auth_token: 0123456789abcdef, unix_peers: [{as: admin}]}\n",
			[]string{`server.unix_peers[0].uid: required`}},
		{"unix peer of no one", "server: {auth_token: 0123456789abcdef, unix_peers: [{uid: 1000, as: acme}]}\n",
			[]string{`server.unix_peers[0].as: "acme" is neither "admin" nor a tenant's name`}},
		{"unix peer twice", "server: {auth_token: 0123456789abcdef, unix_peers: [{uid: 7, as: admin}, {uid: 7, as: admin}]}\n",
			[]string{`server.unix_peers[1].uid: uid 7 is also server.unix_peers[0]`}},
		{"negative unix peer", "server: {auth_token: 0123456789abcdef, unix_peers: [{uid: -1, as: admin}]}\n",
			[]string{`server.unix_peers[0].uid: must not be negative`}},
		{"negative limit", "limits: {max_keys_per_call: -1}\n",
			[]string{`limits.max_keys_per_call: must not be negative`}},
		{"unknown nested key", "primary:\n  size: 1GiB\n",
			[]string{`primary.size: unknown key (want one of: bytes, policy, arena)`}},
		{"duplicate key", "validation: strict\nvalidation: lenient\n",
			[]string{`validation: duplicate key (first set on line 1)`}},
		{"bad policy", "primary: {policy: fifo}\n",
			[]string{`primary.policy: invalid value "fifo" (want lru or arc)`}},
		{"bad arena kind", "primary: {arena: {kind: hugepages}}\n",
			[]string{`primary.arena.kind: invalid value "hugepages" (want anonymous, file or memfd)`}},
		{"file arena without path", "primary: {arena: {kind: file}}\n",
			[]string{`primary.arena.path: required when primary.arena.kind is file`}},
		{"path without file arena", "primary: {arena: {path: /dev/shm/x}}\n",
			[]string{`primary.arena.path: only used when primary.arena.kind is file (kind is anonymous)`}},
		{"bad size", "primary: {bytes: lots}\n",
			[]string{`primary.bytes: invalid value "lots" (want a size`}},
		{"ambiguous unit", "namespace: {bytes_per_block: 2M}\n",
			[]string{`namespace.bytes_per_block: invalid value "2M": unknown unit "M"`}},
		{"zero block", "namespace: {bytes_per_block: 0}\n",
			[]string{`namespace.bytes_per_block: must be positive, got 0`}},
		{"primary smaller than a block", "primary: {bytes: 1MiB}\n",
			[]string{`primary.bytes: 1MiB holds no block of namespace.bytes_per_block = 2MiB`}},
		{"model not a string", "namespace: {model: [a, b]}\n",
			[]string{`namespace.model: want a string, got a list`}},
		{"section not a mapping", "primary: big\n",
			[]string{`primary: want a mapping of keys, got "big"`}},
		{"bad validation", "validation: paranoid\n",
			[]string{`validation: invalid value "paranoid" (want lenient or strict)`}},
		{"tiers not a list", "secondary_tiers: {type: memory}\n",
			[]string{`secondary_tiers: want a list, got a mapping`}},
		{"tier without type", "secondary_tiers:\n  - name: a\n",
			[]string{`secondary_tiers[0].type: missing (every secondary tier needs a type, such as memory)`}},
		{"empty tier entry", "secondary_tiers:\n  -\n",
			[]string{`secondary_tiers[0]: want a tier such as {name: cache, type: memory}, got nothing`}},
		{"tier type not a string", "secondary_tiers: [{type: [memory]}]\n",
			[]string{`secondary_tiers[0].type: want a tier type such as memory, got a list`}},
		{"duplicate name", "secondary_tiers:\n  - {name: a, type: memory}\n  - {name: a, type: memory}\n",
			[]string{`secondary_tiers[1].name: duplicate name "a" (also secondary_tiers[0])`}},
		{"explicit name collides with a default name", "secondary_tiers:\n  - {type: memory}\n  - {name: memory0, type: memory}\n",
			[]string{`secondary_tiers[1].name: duplicate name "memory0" (also secondary_tiers[0])`}},
		{"bad name", "secondary_tiers: [{name: 'my tier', type: memory}]\n",
			[]string{`secondary_tiers[0].name: invalid name "my tier"`}},
		{"duplicate key in a tier", "secondary_tiers:\n  - type: memory\n    medium: cpu\n    medium: storage\n",
			[]string{`secondary_tiers[0].medium: duplicate key (first set on line 3)`}},
		{"default filter bad medium", "default_load_tiers: [{medium: moon}]\n",
			[]string{`default_load_tiers[0].medium: invalid value "moon" (want cpu or storage)`}},
		{"default filter bad locality", "default_store_tiers: [{medium: cpu}, {locality: 5}]\n",
			[]string{`default_store_tiers[1].locality: invalid value 5 (want local or remote)`}},
		{"default filter not a list", "default_load_tiers: storage\n",
			[]string{`default_load_tiers: want a list of matchers such as [{medium: storage}], got "storage"`}},
		{"default filter entry not a mapping", "default_load_tiers: [cpu]\n",
			[]string{`default_load_tiers[0]: want a matcher such as {medium: storage, locality: local}, got "cpu"`}},
		{"default filter unknown matcher key", "default_load_tiers: [{medum: storage}]\n",
			[]string{`default_load_tiers[0].medum: unknown key (want medium or locality)`}},
		{"several problems reported together", "validation: x\nprimary: {policy: y}\n",
			[]string{`validation: invalid value "x"`, `primary.policy: invalid value "y"`}},
		{"two documents", "validation: strict\n---\nvalidation: lenient\n",
			[]string{`want one YAML document, found more`}},
		{"syntax error", "primary: {bytes: 1\n",
			[]string{`yaml: line`}},
		{"syntax error in a second document", "validation: strict\n--- [\n",
			[]string{`yaml: line 2`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := Parse([]byte(tc.doc))
			if err == nil {
				t.Fatalf("Parse succeeded (%+v), want an error containing %q", cfg, tc.want)
			}
			msg := err.Error()
			var ce *Error
			if !errors.As(err, &ce) {
				t.Errorf("error %q is not a *config.Error", msg)
			}
			rest := msg
			for _, w := range tc.want {
				i := strings.Index(rest, w)
				if i < 0 {
					t.Fatalf("error %q does not contain %q (in order)", msg, w)
				}
				rest = rest[i+len(w):]
			}
		})
	}
}

func TestLoadErrorNamesFileAndLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kvtier.yaml")
	doc := "secondary_tiers:\n  - type: memory\n    locality: moon\n"
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(path)
	if err != nil {
		t.Fatalf("Load: %v (the memory keys are decoded by tierset, not here)", err)
	}
	type spec struct {
		Locality Locality `yaml:"locality"`
	}
	var s spec
	err = cfg.SecondaryTiers[0].Decode(&s)
	want := path + `:3: secondary_tiers[0].locality: invalid value "moon" (want local or remote)`
	if err == nil || err.Error() != want {
		t.Errorf("Decode error = %v, want %s", err, want)
	}

	if err := os.WriteFile(path, []byte("validation: x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = Load(path)
	if want := path + `:1: validation: invalid value "x" (want lenient or strict)`; err == nil || err.Error() != want {
		t.Errorf("Load error = %v, want %s", err, want)
	}
	if _, err := Load(filepath.Join(t.TempDir(), "missing.yaml")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Load of a missing file = %v, want ErrNotExist", err)
	}
}

type testTier struct {
	Medium   Medium             `yaml:"medium"`
	Locality Locality           `yaml:"locality"`
	Blocks   int                `yaml:"capacity_blocks"`
	Latency  time.Duration      `yaml:"latency"`
	Timeout  confvalue.Duration `yaml:"timeout"`
	Rate     float64            `yaml:"fail_rate"`
	Async    bool               `yaml:"async_lookup"`
	Limits   *struct {
		Max int `yaml:"max"`
	} `yaml:"limits"`
	Extra map[string]any `yaml:"extra"`
}

func TestTierSpecDecode(t *testing.T) {
	cases := []struct {
		name string
		tier string
		want testTier
		err  string
	}{
		{name: "absent keys keep defaults", tier: "{type: memory}", want: testTier{Blocks: 7}},
		{name: "all keys", tier: "{type: memory, medium: Storage, locality: LOCAL, capacity_blocks: 3, latency: 5ms, fail_rate: 0.5, async_lookup: true, limits: {max: 2}}",
			want: testTier{Medium: Medium(offload.MediumStorage), Locality: Locality(offload.LocalityLocal), Blocks: 3,
				Latency: 5 * time.Millisecond, Rate: 0.5, Async: true, Limits: &struct {
					Max int `yaml:"max"`
				}{2}}},
		{name: "free-form values", tier: "{type: memory, extra: {a: [1, {b: c}], d: ~}}",
			want: testTier{Blocks: 7, Extra: map[string]any{"a": []any{1, map[string]any{"b": "c"}}, "d": nil}}},
		{name: "null medium is dynamic", tier: "{type: memory, medium: ~, locality: null}", want: testTier{Blocks: 7}},
		{name: "unknown key", tier: "{type: memory, colour: red}",
			err: `secondary_tiers[0].colour: unknown key (want one of: name, type, medium, locality, capacity_blocks, latency, timeout, fail_rate, async_lookup, limits, extra)`},
		{name: "bad medium", tier: "{type: memory, medium: gpu}",
			err: `secondary_tiers[0].medium: invalid value "gpu" (want cpu or storage)`},
		{name: "global is not a config locality", tier: "{type: memory, locality: global}",
			err: `secondary_tiers[0].locality: invalid value "global" (want local or remote)`},
		{name: "empty medium", tier: "{type: memory, medium: ''}",
			err: `secondary_tiers[0].medium: invalid value "" (want cpu or storage)`},
		{name: "medium not a scalar", tier: "{type: memory, medium: [cpu]}",
			err: `secondary_tiers[0].medium: invalid value a list (want cpu or storage)`},
		{name: "bad int", tier: "{type: memory, capacity_blocks: many}",
			err: `secondary_tiers[0].capacity_blocks: invalid value "many" (want an integer)`},
		{name: "bad duration", tier: "{type: memory, latency: 5}",
			err: `secondary_tiers[0].latency: invalid value "5" (want a duration such as 250ms or 2s)`},
		{name: "config duration is case-insensitive", tier: "{type: memory, timeout: 1500MS}",
			want: testTier{Blocks: 7, Timeout: confvalue.Duration(1500 * time.Millisecond)}},
		{name: "negative config duration", tier: "{type: memory, timeout: -1s}",
			err: `secondary_tiers[0].timeout: invalid value "-1s" (must not be negative)`},
		{name: "bad config duration", tier: "{type: memory, timeout: 3}",
			err: `secondary_tiers[0].timeout: invalid value "3" (want a duration such as 250ms or 2s)`},
		{name: "bad bool", tier: "{type: memory, async_lookup: maybe}",
			err: `secondary_tiers[0].async_lookup: invalid value "maybe" (want true or false)`},
		{name: "nested unknown key", tier: "{type: memory, limits: {min: 1}}",
			err: `secondary_tiers[0].limits.min: unknown key (want one of: max)`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := Parse([]byte("secondary_tiers: [" + tc.tier + "]\n"))
			if err != nil {
				t.Fatal(err)
			}
			got := testTier{Blocks: 7}
			err = cfg.SecondaryTiers[0].Decode(&got)
			if tc.err != "" {
				if err == nil || err.Error() != tc.err {
					t.Fatalf("Decode error = %v, want %s", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.Limits != nil && tc.want.Limits != nil && *got.Limits == *tc.want.Limits {
				got.Limits, tc.want.Limits = nil, nil
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Decode = %+v, want %+v", got, tc.want)
			}
		})
	}

	cfg, err := Parse([]byte("secondary_tiers:\n  - type: memory\n    fail_rate: 2\n"))
	if err != nil {
		t.Fatal(err)
	}
	spec := cfg.SecondaryTiers[0]
	if err := spec.Decode(testTier{}); err == nil {
		t.Error("Decode into a non-pointer succeeded")
	}
	var ce *Error
	if err := spec.Errorf("fail_rate", "must be in [0, 1], got %v", 2); !errors.As(err, &ce) || ce.Line != 3 ||
		err.Error() != "secondary_tiers[0].fail_rate: must be in [0, 1], got 2" {
		t.Errorf("Errorf = %v (line %d)", err, ce.Line)
	}
}

// TestAliasExpansionIsBounded: YAML aliases let a small file name a huge
// value (each alias of a list of n items, used n times, is n² items). A
// tier entry's keys are decoded into typed values, which yaml.v3's own
// alias limit does not cover, so the decoder bounds the values it builds.
func TestAliasExpansionIsBounded(t *testing.T) {
	const n = 2000 // 4 M strings from a 14 KB document
	doc := "secondary_tiers:\n  - type: fs\n    groups: [&g {names: [" +
		strings.Repeat("a, ", n-1) + "a]}" + strings.Repeat(", *g", n-1) + "]\n"
	cfg, err := Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Groups []struct {
			Names []string `yaml:"names"`
		} `yaml:"groups"`
	}
	err = cfg.SecondaryTiers[0].Decode(&v)
	var ce *Error
	if !errors.As(err, &ce) || !strings.HasPrefix(ce.Path, "secondary_tiers[0].groups[") || !strings.Contains(ce.Msg, "aliases") {
		t.Fatalf("Decode of %d×%d aliased values: error %v, want one naming the path and the aliases", n, n, err)
	}
}

// An empty config file (or one of comments only) is refused with a reason:
// it would run the daemon on built-in defaults without a word.
func TestEmptyFileIsRefused(t *testing.T) {
	for _, doc := range []string{"", "\n\n", "# all commented out\n# primary: {bytes: 1GiB}\n"} {
		p := filepath.Join(t.TempDir(), "kvtier.yaml")
		if err := os.WriteFile(p, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := Load(p)
		if err == nil || !strings.Contains(err.Error(), "has no keys") || !strings.Contains(err.Error(), p) {
			t.Errorf("%q: %v; want an error naming the file and saying it has no keys", doc, err)
		}
	}
	if _, err := Parse(nil); err != nil {
		t.Errorf("Parse of no document (the defaults, for callers without a file): %v", err)
	}
}

// The cascade budget, back-pressure and region settings are config keys,
// validated with the key's path.
func TestCascadeAndRegionKeys(t *testing.T) {
	c, err := Parse([]byte(`
cascades:
  pin_budget: 0.5
  tier_share: 1
  back_pressure: {enabled: false, alpha: 0.5, high: 2s, low: 1s, warmup: -1}
regions: {max_regions: 8, max_requests: 100, lookup_wait: 1s, tick: 2ms}
`))
	if err != nil {
		t.Fatal(err)
	}
	if share, _ := c.Cascades.PinBudgetShare(); share != 0.5 || c.Cascades.TierShare != 1 || *c.Cascades.BackPressure.Enabled ||
		c.Cascades.BackPressure.Warmup != -1 || c.Regions.MaxRegions != 8 || time.Duration(c.Regions.Tick) != 2*time.Millisecond {
		t.Fatalf("decoded %+v %+v", c.Cascades, c.Regions)
	}
	if c, err := Parse([]byte("cascades: {pin_budget: \"off\"}\n")); err != nil {
		t.Fatal(err)
	} else if share, _ := c.Cascades.PinBudgetShare(); share != -1 {
		t.Fatalf("off: %v", share)
	}
	for doc, want := range map[string]string{
		"cascades: {pin_budget: 1.5}":                        "cascades.pin_budget",
		"cascades: {pin_budget: lots}":                       "cascades.pin_budget",
		"cascades: {tier_share: 0}\ncascades2: 1":            "cascades2: unknown key",
		"cascades: {tier_share: 2}":                          "cascades.tier_share",
		"cascades: {back_pressure: {alpha: 2}}":              "cascades.back_pressure.alpha",
		"cascades: {back_pressure: {high: 1s, low: 2s}}":     "cascades.back_pressure.low",
		"cascades: {back_pressure: {warmup: -5}}":            "cascades.back_pressure.warmup",
		"regions: {max_regions: -1}":                         "regions.max_regions",
		"cascades: {back_pressure: {enabled: true, hi: 1s}}": "cascades.back_pressure.hi: unknown key",
	} {
		if _, err := Parse([]byte(doc)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v; want an error naming %s", doc, err, want)
		}
	}
}
