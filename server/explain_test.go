package server_test

import (
	"strings"
	"testing"

	kvtierv1 "github.com/kvtier/kvtier/api/kvtier/v1"
	"github.com/kvtier/kvtier/explain"
	"github.com/kvtier/kvtier/offload"
)

// TestExplainIsTiersetExplain checks that the Explain call answers what
// explain.Explain (and so kvtier explain) computes for the same tiers,
// defaults and params: the same filters, verdicts and reasons.
func TestExplainIsTiersetExplain(t *testing.T) {
	parser := offload.Parser{DefaultStore: offload.NewTierFilter(offload.TierMatcher{Medium: offload.MediumStorage})}
	e := startEnv(t, envOptions{parser: parser})
	c := e.dial(t, "unix://"+e.unix)
	decls := []explain.Declaration{
		{Name: "remote-cpu", Type: "memory", Medium: offload.MediumCPU, Locality: offload.LocalityRemote},
		{Name: "local-disk", Type: "memory", Medium: offload.MediumStorage, Locality: offload.LocalityLocal},
	}
	for _, params := range []string{
		``,
		`{"kv_load_tiers": [{"medium": "cpu"}]}`,
		`{"kv_load_tiers": [], "kv_store_tiers": [{"locality": "remote"}]}`,
		`{"kv_load_tiers": "storage"}`,                  // not a list: falls back to ALL
		`{"kv_load_tiers": [{"locality": "local"}, 7]}`, // one bad entry
	} {
		t.Run(params, func(t *testing.T) {
			got, err := c.Explain(ctxT(t), params)
			if err != nil {
				t.Fatal(err)
			}
			p := parser
			var raw any
			if params != "" {
				raw = params
			}
			rc, err := p.NewReqContext("explain", raw)
			if err != nil {
				t.Fatal(err)
			}
			want := explain.Explain(decls, &p, rc)
			if got.GetLoadFilter().GetText() != want.Load.Filter.String() || got.GetStoreFilter().GetText() != want.Store.Filter.String() ||
				got.GetLoadFromRequest() != want.Load.FromRequest || got.GetStoreFromRequest() != want.Store.FromRequest ||
				len(got.GetWarnings()) != len(want.Warnings) || got.GetValidationMode() != "lenient" || got.GetStrictError() != "" {
				t.Fatalf("got %v\nwant %+v", got, want)
			}
			if len(got.GetTiers()) != len(want.Tiers) {
				t.Fatalf("%d tiers, want %d", len(got.GetTiers()), len(want.Tiers))
			}
			for i, v := range want.Tiers {
				d := got.GetTiers()[i]
				if d.GetName() != v.Name || d.GetType() != v.Type ||
					d.GetMedium() != kvtierv1.Medium(v.Medium) || d.GetLocality() != kvtierv1.Locality(v.Locality) {
					t.Fatalf("tier %d: %v, want %v", i, d, v.Declaration)
				}
				check := func(dir string, allowed bool, reason string, v explain.Verdict, s explain.Side) {
					t.Helper()
					if allowed != v.Allowed || !strings.HasPrefix(reason, v.Reason) || !strings.Contains(reason, s.Source()) {
						t.Errorf("%s %s: %v %q, want %v %q from %q", v.Reason, dir, allowed, reason, v.Allowed, v.Reason, s.Source())
					}
				}
				check("load", d.GetLoad(), d.GetLoadReason(), v.Load, want.Load)
				check("store", d.GetStore(), d.GetStoreReason(), v.Store, want.Store)
			}
		})
	}
}
