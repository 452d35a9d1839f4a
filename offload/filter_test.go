package offload_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"testing"

	"github.com/kvtier/kvtier/offload"
)

// Shorthands for the spec's notation: M(CPU), M(STORAGE, LOCAL), M().
const (
	anyM    = offload.MediumUnspecified
	cpu     = offload.MediumCPU
	storage = offload.MediumStorage
	anyL    = offload.LocalityUnspecified
	local   = offload.LocalityLocal
	remote  = offload.LocalityRemote
)

func M(m offload.Medium, l offload.Locality) offload.TierMatcher {
	return offload.TierMatcher{Medium: m, Locality: l}
}

// decode decodes one JSON value the way the parser's callers do (numbers
// as json.Number).
func decode(t testing.TB, s string) any {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader([]byte(s)))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("decode %s: %v", s, err)
	}
	return v
}

func reasons(ws []offload.Warning) []string {
	var out []string
	for _, w := range ws {
		out = append(out, w.Reason)
	}
	return out
}

// parseCase is one kv_load_tiers value and the filter it must produce:
// the All sentinel (identity) or exactly the given matchers.
type parseCase struct {
	name     string
	raw      string // JSON value of the field
	all      bool   // result must be identical to All
	matchers []offload.TierMatcher
	reasons  []string
}

// acceptanceCases are docs/semantics.md §7.A cases 1–10 followed by its derived cases.
var acceptanceCases = []parseCase{
	{name: "1 storage", raw: `[{"medium":"storage"}]`, matchers: []offload.TierMatcher{M(storage, anyL)}},
	{name: "2 CPU upper-case", raw: `[{"medium":"CPU"}]`, matchers: []offload.TierMatcher{M(cpu, anyL)}},
	{name: "3 unconstrained entry", raw: `[{}]`, matchers: []offload.TierMatcher{M(anyM, anyL)}},
	{name: "4 storage local", raw: `[{"medium":"storage","locality":"local"}]`, matchers: []offload.TierMatcher{M(storage, local)}},
	{name: "5 two entries in order", raw: `[{"medium":"cpu"},{"medium":"storage"}]`, matchers: []offload.TierMatcher{M(cpu, anyL), M(storage, anyL)}},
	{name: "6 empty list denies all", raw: `[]`, matchers: []offload.TierMatcher{}},
	{name: "7 not a list", raw: `"not a list"`, all: true, reasons: []string{offload.ReasonNotList}},
	{name: "8 unknown medium", raw: `[{"medium":"unknown"}]`, all: true, reasons: []string{offload.ReasonUnknownMedium}},
	{name: "9 unknown locality", raw: `[{"locality":"nowhere"}]`, all: true, reasons: []string{offload.ReasonUnknownLocality}},
	{name: "10 partially valid", raw: `[{"medium":"storage"}, "not a dict", {"medium":"bogus"}, {"medium":"cpu"}]`,
		matchers: []offload.TierMatcher{M(storage, anyL), M(cpu, anyL)},
		reasons:  []string{offload.ReasonEntryNotObject, offload.ReasonUnknownMedium}},

	// Derived cases.
	{name: "medium is a number", raw: `[{"medium":5}]`, all: true, reasons: []string{offload.ReasonUnknownMedium}},
	{name: "medium is a boolean", raw: `[{"medium":true}]`, all: true, reasons: []string{offload.ReasonUnknownMedium}},
	{name: "medium is empty", raw: `[{"medium":""}]`, all: true, reasons: []string{offload.ReasonUnknownMedium}},
	{name: "whitespace not trimmed", raw: `[{"medium":" cpu"}]`, all: true, reasons: []string{offload.ReasonUnknownMedium}},
	{name: "object not list", raw: `{"medium":"cpu"}`, all: true, reasons: []string{offload.ReasonNotList}},
	{name: "number not list", raw: `7`, all: true, reasons: []string{offload.ReasonNotList}},
	{name: "boolean not list", raw: `false`, all: true, reasons: []string{offload.ReasonNotList}},
	{name: "extra key ignored", raw: `[{"medium":"cpu","x":1}]`, matchers: []offload.TierMatcher{M(cpu, anyL)}},
	{name: "null fields unconstrained", raw: `[{"medium":null,"locality":null}]`, matchers: []offload.TierMatcher{M(anyM, anyL)}},
	{name: "mixed case", raw: `[{"medium":"StOrAgE","locality":"Remote"}]`, matchers: []offload.TierMatcher{M(storage, remote)}},
	{name: "global is remote", raw: `[{"locality":"global"}]`, matchers: []offload.TierMatcher{M(anyM, remote)}},
	{name: "GLOBAL upper-case", raw: `[{"medium":"cpu","locality":"GLOBAL"}]`, matchers: []offload.TierMatcher{M(cpu, remote)}},
	{name: "duplicates kept", raw: `[{"medium":"cpu"},{"medium":"cpu"}]`, matchers: []offload.TierMatcher{M(cpu, anyL), M(cpu, anyL)}},
	{name: "null entry skipped", raw: `[null]`, all: true, reasons: []string{offload.ReasonEntryNotObject}},
	{name: "nested list entry", raw: `[[{"medium":"cpu"}]]`, all: true, reasons: []string{offload.ReasonEntryNotObject}},
	{name: "bad medium wins over bad locality", raw: `[{"medium":"x","locality":"y"}]`, all: true, reasons: []string{offload.ReasonUnknownMedium}},
	{name: "good medium bad locality", raw: `[{"medium":"cpu","locality":"y"},{"locality":"local"}]`,
		matchers: []offload.TierMatcher{M(anyM, local)}, reasons: []string{offload.ReasonUnknownLocality}},
	{name: "all entries invalid", raw: `[1, "a", {"medium":"gpu"}]`, all: true,
		reasons: []string{offload.ReasonEntryNotObject, offload.ReasonEntryNotObject, offload.ReasonUnknownMedium}},
}

func checkFilter(t *testing.T, f *offload.TierFilter, c parseCase) {
	t.Helper()
	if f == nil {
		t.Fatal("nil filter")
	}
	if c.all {
		if f != offload.All() || !f.IsAll() {
			t.Fatalf("got %v (IsAll=%v), want the All sentinel", f, f.IsAll())
		}
		return
	}
	if f.IsAll() {
		t.Fatalf("got the All sentinel, want matchers %v", c.matchers)
	}
	if got := f.Matchers(); !slices.Equal(got, c.matchers) {
		t.Fatalf("matchers = %v, want %v", got, c.matchers)
	}
	if !f.Equal(offload.NewTierFilter(c.matchers...)) {
		t.Fatalf("%v not Equal to NewTierFilter(%v)", f, c.matchers)
	}
	if f.DeniesAll() != (len(c.matchers) == 0) {
		t.Fatalf("DeniesAll = %v with %d matchers", f.DeniesAll(), len(c.matchers))
	}
}

func TestParseTierFilterAcceptance(t *testing.T) {
	for _, c := range acceptanceCases {
		t.Run(c.name, func(t *testing.T) {
			f, ws := offload.ParseTierFilter(offload.KeyLoadTiers, decode(t, c.raw))
			checkFilter(t, f, c)
			if got := reasons(ws); !slices.Equal(got, c.reasons) {
				t.Fatalf("warning reasons = %v, want %v", got, c.reasons)
			}
			for _, w := range ws {
				if w.Field != offload.KeyLoadTiers || w.Message == "" || w.Value == "" {
					t.Errorf("incomplete warning %+v", w)
				}
			}
		})
	}
}

// TestStoreTiersSameParser: kv_store_tiers goes through the same parser
// (same results, same warnings, naming its own field) and does not touch
// the load filter.
func TestStoreTiersSameParser(t *testing.T) {
	for _, c := range acceptanceCases {
		t.Run(c.name, func(t *testing.T) {
			params := `{"kv_store_tiers":` + c.raw + `}`
			rc, err := offload.NewReqContext("r", []byte(params))
			if err != nil {
				t.Fatal(err)
			}
			checkFilter(t, rc.StoreFilter, c)
			if !rc.LoadFilter.IsAll() || rc.LoadFromRequest || !rc.StoreFromRequest {
				t.Fatalf("load=%v fromReq=%v/%v", rc.LoadFilter, rc.LoadFromRequest, rc.StoreFromRequest)
			}
			if got := reasons(rc.Warnings); !slices.Equal(got, c.reasons) {
				t.Fatalf("warning reasons = %v, want %v", got, c.reasons)
			}
			for _, w := range rc.Warnings {
				if w.Field != offload.KeyStoreTiers {
					t.Errorf("warning field %q, want %q", w.Field, offload.KeyStoreTiers)
				}
			}
		})
	}
}

// TestMissingOrNullIsAllWithoutWarning: derived case "None / missing key
// ⇒ ALL without warning", for every shape of empty params.
func TestMissingOrNullIsAllWithoutWarning(t *testing.T) {
	for _, params := range []any{nil, "", "  ", "null", "{}", `{"kv_load_tiers":null,"kv_store_tiers":null}`,
		`{"other":1}`, map[string]any{}, map[string]any{"kv_load_tiers": nil}} {
		t.Run(fmt.Sprint(params), func(t *testing.T) {
			rc, err := offload.NewReqContext("r", params)
			if err != nil {
				t.Fatal(err)
			}
			if rc.LoadFilter != offload.All() || rc.StoreFilter != offload.All() {
				t.Fatalf("filters %v / %v, want All", rc.LoadFilter, rc.StoreFilter)
			}
			if rc.LoadFromRequest || rc.StoreFromRequest || len(rc.Warnings) != 0 {
				t.Fatalf("fromRequest %v/%v warnings %v", rc.LoadFromRequest, rc.StoreFromRequest, rc.Warnings)
			}
		})
	}
}

// allowsRows lists the 3×3 answers of a filter, rows by tier medium
// (unspecified, CPU, STORAGE), columns by tier locality (unspecified,
// LOCAL, REMOTE). Derived by hand from docs/semantics.md §1.4–§1.5, not from the code.
var allowsRows = []struct {
	name   string
	filter *offload.TierFilter
	want   string
}{
	{"ALL", offload.All(), "YYY YYY YYY"},
	{"[] deny all", offload.NewTierFilter(), "NNN NNN NNN"},
	{"[M()] wildcard", offload.NewTierFilter(M(anyM, anyL)), "YYY YYY YYY"},
	{"[M(CPU)]", offload.NewTierFilter(M(cpu, anyL)), "YYY YYY NNN"},
	{"[M(STORAGE)]", offload.NewTierFilter(M(storage, anyL)), "YYY NNN YYY"},
	{"[M(STORAGE,LOCAL)]", offload.NewTierFilter(M(storage, local)), "YYN NNN YYN"},
	{"[M(nil,LOCAL)]", offload.NewTierFilter(M(anyM, local)), "YYN YYN YYN"},
	{"[M(nil,REMOTE)]", offload.NewTierFilter(M(anyM, remote)), "YNY YNY YNY"},
	{"[M(CPU,REMOTE)]", offload.NewTierFilter(M(cpu, remote)), "YNY YNY NNN"},
	{"[M(CPU), M(STORAGE,LOCAL)]", offload.NewTierFilter(M(cpu, anyL), M(storage, local)), "YYY YYY YYN"},
	{"[M(CPU,REMOTE), M(STORAGE,LOCAL)]", offload.NewTierFilter(M(cpu, remote), M(storage, local)), "YYY YNY YYN"},
}

var (
	media      = []offload.Medium{anyM, cpu, storage}
	localities = []offload.Locality{anyL, local, remote}
)

func TestAllowsTruthTable(t *testing.T) {
	for _, r := range allowsRows {
		t.Run(r.name, func(t *testing.T) {
			want := []byte(r.want)
			for i, m := range media {
				for j, l := range localities {
					exp := want[i*4+j] == 'Y'
					if got := r.filter.Allows(m, l); got != exp {
						t.Errorf("Allows(%q,%q) = %v, want %v", m, l, got, exp)
					}
					_, matched := r.filter.Match(m, l)
					if matched != exp {
						t.Errorf("Match(%q,%q) ok = %v, want %v", m, l, matched, exp)
					}
				}
			}
		})
	}
}

// TestAllowsDerivedCases spells out the derived bullets of docs/semantics.md §7.A.
func TestAllowsDerivedCases(t *testing.T) {
	cpuF := offload.NewTierFilter(M(cpu, anyL))
	sl := offload.NewTierFilter(M(storage, local))
	nl := offload.NewTierFilter(M(anyM, local))
	or := offload.NewTierFilter(M(cpu, anyL), M(storage, local))
	deny := offload.NewTierFilter()
	cases := []struct {
		name string
		f    *offload.TierFilter
		m    offload.Medium
		l    offload.Locality
		want bool
	}{
		{"M(CPU) vs (CPU,nil)", cpuF, cpu, anyL, true},
		{"M(CPU) vs (nil,nil)", cpuF, anyM, anyL, true},
		{"M(CPU) vs (STORAGE,LOCAL)", cpuF, storage, local, false},
		{"M(STORAGE,LOCAL) vs (STORAGE,LOCAL)", sl, storage, local, true},
		{"M(STORAGE,LOCAL) vs (STORAGE,nil)", sl, storage, anyL, true},
		{"M(STORAGE,LOCAL) vs (nil,LOCAL)", sl, anyM, local, true},
		{"M(STORAGE,LOCAL) vs (nil,REMOTE)", sl, anyM, remote, false},
		{"M(STORAGE,LOCAL) vs (CPU,LOCAL)", sl, cpu, local, false},
		{"M(nil,LOCAL) vs (STORAGE,REMOTE)", nl, storage, remote, false},
		{"M(nil,LOCAL) vs (CPU,LOCAL)", nl, cpu, local, true},
		{"OR vs (STORAGE,REMOTE)", or, storage, remote, false},
		{"OR vs (CPU,REMOTE)", or, cpu, remote, true},
		{"non-empty vs (nil,nil)", sl, anyM, anyL, true},
		{"[] vs (nil,nil)", deny, anyM, anyL, false},
		{"[] vs (CPU,LOCAL)", deny, cpu, local, false},
		{"ALL vs (STORAGE,REMOTE)", offload.All(), storage, remote, true},
		{"nil filter means ALL", nil, storage, remote, true},
	}
	for _, c := range cases {
		if got := c.f.Allows(c.m, c.l); got != c.want {
			t.Errorf("%s: Allows = %v, want %v", c.name, got, c.want)
		}
	}
}

// TestAllIdentityVersusValue: All is a sentinel. A parsed [{}] allows the
// same tiers and is Equal to it, but only the sentinel IsAll.
func TestAllIdentityVersusValue(t *testing.T) {
	wild, _ := offload.ParseTierFilter(offload.KeyLoadTiers, decode(t, `[{}]`))
	fallback, _ := offload.ParseTierFilter(offload.KeyLoadTiers, decode(t, `"x"`))
	cases := []struct {
		name         string
		f            *offload.TierFilter
		isAll, equal bool
	}{
		{"All()", offload.All(), true, true},
		{"nil", nil, true, true},
		{"fallback of a non-list", fallback, true, true},
		{"parsed [{}]", wild, false, true},
		{"NewTierFilter(M())", offload.NewTierFilter(M(anyM, anyL)), false, true},
		{"[M(),M()]", offload.NewTierFilter(M(anyM, anyL), M(anyM, anyL)), false, false},
		{"deny all", offload.NewTierFilter(), false, false},
		{"[M(CPU)]", offload.NewTierFilter(M(cpu, anyL)), false, false},
	}
	for _, c := range cases {
		if got := c.f.IsAll(); got != c.isAll {
			t.Errorf("%s: IsAll = %v, want %v", c.name, got, c.isAll)
		}
		if got := c.f.Equal(offload.All()); got != c.equal {
			t.Errorf("%s: Equal(All) = %v, want %v", c.name, got, c.equal)
		}
		if got := offload.All().Equal(c.f); got != c.equal {
			t.Errorf("%s: All.Equal = %v, want %v (not symmetric)", c.name, got, c.equal)
		}
	}
	if a, b := offload.All(), offload.All(); a != b {
		t.Error("All() is not a single sentinel")
	}
	if offload.All().String() != "ALL" || offload.NewTierFilter().String() != "[]" {
		t.Errorf("String: %q %q", offload.All(), offload.NewTierFilter())
	}
}

// TestAllowsOutOfRange: values outside the constants are denied (never
// aliased onto a valid pair) and never panic.
func TestAllowsOutOfRange(t *testing.T) {
	filters := []*offload.TierFilter{nil, offload.All(), offload.NewTierFilter(M(anyM, anyL)),
		offload.NewTierFilter(M(cpu, anyL), M(storage, anyL)), offload.NewTierFilter(M(anyM, remote))}
	var bad []offload.Medium
	for m := 3; m < 256; m++ {
		bad = append(bad, offload.Medium(m))
	}
	for _, f := range filters {
		for l := 0; l < 256; l++ {
			for _, m := range bad {
				if f.Allows(m, offload.Locality(l)) {
					t.Fatalf("%v allows medium %d locality %d", f, m, l)
				}
			}
			if l >= 3 {
				for _, m := range media {
					if f.Allows(m, offload.Locality(l)) {
						t.Fatalf("%v allows medium %d locality %d", f, m, l)
					}
				}
			}
		}
	}
}

func TestFilterImmutable(t *testing.T) {
	in := []offload.TierMatcher{M(cpu, anyL)}
	f := offload.NewTierFilter(in...)
	in[0] = M(storage, anyL)
	out := f.Matchers()
	out[0] = M(storage, local)
	if !f.Allows(cpu, local) || f.Allows(storage, local) {
		t.Fatal("filter changed through a caller's slice")
	}
	all := offload.All().Matchers()
	all[0] = M(cpu, local)
	if !offload.All().Allows(storage, remote) || !offload.All().Equal(offload.NewTierFilter(M(anyM, anyL))) {
		t.Fatal("All changed through Matchers")
	}
}
