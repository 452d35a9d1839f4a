package tierset

import (
	"slices"
	"strings"
	"testing"

	"github.com/kvtier/kvtier/explain"
	"github.com/kvtier/kvtier/offload"
)

// TestExplainExamples is the "Examples" table of the filter design
// discussion against four declared tiers: fs-like STORAGE/LOCAL, s3-like
// STORAGE/REMOTE, redis-like CPU/REMOTE and a dynamic peer-like tier.
func TestExplainExamples(t *testing.T) {
	all := []string{"local-ssd", "s3", "redis", "peer"}
	cases := []struct {
		name        string
		defaults    string // extra config lines
		params      string
		load, store []string
	}{
		{"primary only", "", `{"kv_load_tiers":[],"kv_store_tiers":[]}`, []string{}, []string{}},
		{"CPU tiers everywhere", "", `{"kv_load_tiers":[{"medium":"cpu"}],"kv_store_tiers":[{"medium":"CPU"}]}`,
			[]string{"redis", "peer"}, []string{"redis", "peer"}},
		{"everything local", "", `{"kv_load_tiers":[{"locality":"local"}],"kv_store_tiers":[{"locality":"local"}]}`,
			[]string{"local-ssd", "peer"}, []string{"local-ssd", "peer"}},
		{"remote CPU + local storage", "",
			`{"kv_load_tiers":[{"medium":"cpu","locality":"remote"},{"medium":"storage","locality":"local"}]}`,
			[]string{"local-ssd", "redis", "peer"}, all},
		{"store to storage only", "", `{"kv_store_tiers":[{"medium":"storage"}]}`,
			all, []string{"local-ssd", "s3", "peer"}},
		{"default", "", `{}`, all, all},
		{"global is remote", "", `{"kv_load_tiers":[{"locality":"global"}]}`, []string{"s3", "redis", "peer"}, all},
		{"server defaults apply when omitted", "default_load_tiers: []\ndefault_store_tiers: [{medium: storage}]\n", `{}`,
			[]string{}, []string{"local-ssd", "s3", "peer"}},
		{"null takes the server default", "default_load_tiers: []\n", `{"kv_load_tiers":null}`, []string{}, all},
		{"request overrides the server default", "default_load_tiers: []\n", `{"kv_load_tiers":[{"medium":"storage"}]}`,
			[]string{"local-ssd", "s3", "peer"}, all},
		{"invalid entries fail open", "default_load_tiers: []\n", `{"kv_load_tiers":[{"medium":"moon"}]}`, all, all},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := mustParse(t, fourTiers+tc.defaults)
			decls, err := Declare(cfg)
			if err != nil {
				t.Fatal(err)
			}
			p := cfg.Parser()
			rc, err := p.NewReqContext("r", tc.params)
			if err != nil {
				t.Fatal(err)
			}
			e := explain.Explain(decls, p, rc)
			if got := e.LoadTiers(); !slices.Equal(got, tc.load) {
				t.Errorf("load = %v, want %v", got, tc.load)
			}
			if got := e.StoreTiers(); !slices.Equal(got, tc.store) {
				t.Errorf("store = %v, want %v", got, tc.store)
			}
		})
	}
}

func TestExplainReasons(t *testing.T) {
	decls := []explain.Declaration{
		{Name: "ssd", Type: "memory", Medium: offload.MediumStorage, Locality: offload.LocalityLocal},
		{Name: "peer", Type: "memory", Medium: offload.MediumUnspecified, Locality: offload.LocalityUnspecified},
		{Name: "half", Type: "memory", Medium: offload.MediumStorage, Locality: offload.LocalityUnspecified},
	}
	cases := []struct {
		name     string
		parser   *offload.Parser
		params   string
		source   string   // Load.Source()
		reasons  []string // load reasons per tier
		warnings int
	}{
		{"all", nil, `{}`, "the request omits kv_load_tiers and the server sets no default_load_tiers",
			[]string{"filter is ALL: every tier", "filter is ALL: every tier", "filter is ALL: every tier"}, 0},
		{"deny all", nil, `{"kv_load_tiers":[]}`, "from the request's kv_load_tiers",
			[]string{"filter is []: no secondary tier", "filter is []: no secondary tier", "filter is []: no secondary tier"}, 0},
		{"matchers", nil, `{"kv_load_tiers":[{"medium":"cpu"},{"medium":"storage","locality":"remote"}]}`, "from the request's kv_load_tiers",
			[]string{"no matcher matches STORAGE/LOCAL",
				"matcher {medium:CPU} matches (the tier is dynamic on medium and applies the filter itself)",
				"matcher {medium:STORAGE,locality:REMOTE} matches (the tier is dynamic on locality and applies the filter itself)"}, 0},
		{"unconstrained matcher", nil, `{"kv_load_tiers":[{}]}`, "from the request's kv_load_tiers",
			[]string{"matcher {} matches", "matcher {} matches", "matcher {} matches"}, 0},
		{"fail open", nil, `{"kv_load_tiers":"storage"}`, "the request's kv_load_tiers had no valid entry, so it fell back to ALL (see warnings)",
			[]string{"filter is ALL: every tier", "filter is ALL: every tier", "filter is ALL: every tier"}, 1},
		{"partly valid", nil, `{"kv_load_tiers":[{"medium":"storage"},"x",{"locality":"moon"}]}`, "from the request's kv_load_tiers",
			[]string{"matcher {medium:STORAGE} matches",
				"matcher {medium:STORAGE} matches (the tier is dynamic on medium and applies the filter itself)",
				"matcher {medium:STORAGE} matches"}, 2},
		{"server default", &offload.Parser{DefaultLoad: offload.NewTierFilter()}, `{}`,
			"the request omits kv_load_tiers: server default default_load_tiers",
			[]string{"filter is []: no secondary tier", "filter is []: no secondary tier", "filter is []: no secondary tier"}, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := tc.parser
			if p == nil {
				p = &offload.Parser{}
			}
			rc, err := p.NewReqContext("r", tc.params)
			if err != nil {
				t.Fatal(err)
			}
			e := explain.Explain(decls, tc.parser, rc)
			if got := e.Load.Source(); got != tc.source {
				t.Errorf("source = %q, want %q", got, tc.source)
			}
			for i, v := range e.Tiers {
				if v.Load.Reason != tc.reasons[i] {
					t.Errorf("tier %s: reason %q, want %q", v.Name, v.Load.Reason, tc.reasons[i])
				}
				if v.Load.Allowed != rc.LoadFilter.Allows(v.Medium, v.Locality) {
					t.Errorf("tier %s: verdict differs from Allows", v.Name)
				}
				if denied := strings.HasPrefix(v.Load.Reason, "no matcher") || strings.HasPrefix(v.Load.Reason, "filter is []"); denied == v.Load.Allowed {
					t.Errorf("tier %s: reason %q contradicts allowed=%v", v.Name, v.Load.Reason, v.Load.Allowed)
				}
			}
			if len(e.Warnings) != tc.warnings {
				t.Errorf("warnings = %v, want %d", e.Warnings, tc.warnings)
			}
		})
	}
}

// A peer tier's explanation decides per peer with the request's filter,
// and says it takes no stores.
func TestExplainPeerParts(t *testing.T) {
	cfg := mustParse(t, `secondary_tiers:
  - {name: fleet, type: peer, peers: [{name: far, addr: "10.0.0.8:7070"}, {name: near, addr: "127.0.0.1:7071"}]}
`)
	decls, err := Declare(cfg)
	if err != nil {
		t.Fatal(err)
	}
	details, err := DeclareDetails(cfg)
	if err != nil {
		t.Fatal(err)
	}
	p := cfg.Parser()
	rc, err := p.NewReqContext("r", []byte(`{"kv_load_tiers":[{"locality":"local"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	e := explain.Explain(decls, p, rc)
	e.AddDetails(details)
	v := e.Tiers[0]
	if !v.Load.Allowed || v.Store.Allowed || len(v.Parts) != 2 {
		t.Fatalf("verdict %+v", v)
	}
	if v.Parts[0].Load.Allowed || !v.Parts[1].Load.Allowed || v.Parts[1].Locality != offload.LocalityLocal {
		t.Errorf("parts %+v", v.Parts)
	}
	if got := e.StoreTiers(); len(got) != 0 {
		t.Errorf("stores to %v, want none", got)
	}
}
