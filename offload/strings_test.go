package offload_test

import (
	"math"
	"testing"

	"github.com/kvtier/kvtier/offload"
)

// TestStrings pins the wire and log spellings other packages print
// (events, metrics labels, kvtier explain).
func TestStrings(t *testing.T) {
	cases := []struct {
		got  interface{ String() string }
		want string
	}{
		{offload.MediumCPU, "CPU"},
		{offload.MediumStorage, "STORAGE"},
		{offload.MediumUnspecified, ""},
		{offload.Medium(9), "Medium(9)"},
		{offload.LocalityLocal, "LOCAL"},
		{offload.LocalityRemote, "REMOTE"},
		{offload.LocalityUnspecified, ""},
		{offload.Locality(7), "Locality(7)"},
		{M(storage, local), "{medium:STORAGE,locality:LOCAL}"},
		{M(anyM, remote), "{locality:REMOTE}"},
		{M(anyM, anyL), "{}"},
		{offload.NewTierFilter(M(cpu, anyL), M(storage, local)), "[{medium:CPU} {medium:STORAGE,locality:LOCAL}]"},
		{offload.NewTierFilter(M(anyM, anyL)), "[{}]"},
		{offload.All(), "ALL"},
		{offload.Miss, "MISS"},
		{offload.Hit, "HIT"},
		{offload.HitPending, "HIT_PENDING"},
		{offload.Retry, "RETRY"},
		{offload.LookupResult(9), "LookupResult(9)"},
		{offload.BlockLevel, "BLOCK_LEVEL"},
		{offload.RequestLevel, "REQUEST_LEVEL"},
		{offload.Lenient, "lenient"},
		{offload.Strict, "strict"},
		{offload.Warning{Message: "m"}, "m"},
	}
	for _, c := range cases {
		if s := c.got.String(); s != c.want {
			t.Errorf("%#v.String() = %q, want %q", c.got, s, c.want)
		}
	}
}

// TestMatchExplains: Match names the first matcher that lets a tier in,
// which is what kvtier explain prints.
func TestMatchExplains(t *testing.T) {
	f := offload.NewTierFilter(M(cpu, remote), M(anyM, local), M(storage, anyL))
	cases := []struct {
		m    offload.Medium
		l    offload.Locality
		want offload.TierMatcher
		ok   bool
	}{
		{cpu, remote, M(cpu, remote), true},
		{cpu, local, M(anyM, local), true},
		{storage, local, M(anyM, local), true},
		{storage, remote, M(storage, anyL), true},
		{anyM, anyL, M(cpu, remote), true},
		{offload.Medium(5), local, offload.TierMatcher{}, false},
	}
	for _, c := range cases {
		got, ok := f.Match(c.m, c.l)
		if got != c.want || ok != c.ok {
			t.Errorf("Match(%q,%q) = %v,%v want %v,%v", c.m, c.l, got, ok, c.want, c.ok)
		}
	}
	if _, ok := offload.NewTierFilter().Match(anyM, anyL); ok {
		t.Error("deny-all filter matched")
	}
	var nilF *offload.TierFilter
	if m, ok := nilF.Match(storage, remote); !ok || m != M(anyM, anyL) {
		t.Errorf("nil filter Match = %v,%v", m, ok)
	}
	if got := nilF.Matchers(); len(got) != 1 || got[0] != M(anyM, anyL) {
		t.Errorf("nil filter Matchers = %v", got)
	}
}

// TestParseTierFilterGoValues: values handed over by Go callers that JSON
// cannot produce (NaN, cycles, odd types) give warnings, never panics.
func TestParseTierFilterGoValues(t *testing.T) {
	cyclic := []any{nil}
	cyclic[0] = cyclic
	type named string
	cases := []struct {
		name     string
		raw      any
		all      bool
		matchers []offload.TierMatcher
		reasons  []string
	}{
		{"NaN", math.NaN(), true, nil, []string{offload.ReasonNotList}},
		{"cyclic list", cyclic, true, nil, []string{offload.ReasonEntryNotObject}},
		{"func", func() {}, true, nil, []string{offload.ReasonNotList}},
		{"nil typed slice", []map[string]any(nil), true, nil, []string{offload.ReasonNotList}},
		{"array", [1]map[string]string{{"medium": "cpu"}}, false, []offload.TierMatcher{M(cpu, anyL)}, nil},
		{"map any any with non-string key", []any{map[any]any{1: "x"}}, true, nil, []string{offload.ReasonEntryNotObject}},
		{"named string value", []any{map[string]any{"medium": named("cpu")}}, true, nil, []string{offload.ReasonUnknownMedium}},
		{"named string map", []map[named]string{{"medium": "storage"}}, false, []offload.TierMatcher{M(storage, anyL)}, nil},
		{"bytes are not a list", []byte(`[{"medium":"cpu"}]`), true, nil, []string{offload.ReasonNotList}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f, ws := offload.ParseTierFilter(offload.KeyLoadTiers, c.raw)
			checkFilter(t, f, parseCase{all: c.all, matchers: c.matchers})
			if got := reasons(ws); len(got) != len(c.reasons) || (len(got) > 0 && got[0] != c.reasons[0]) {
				t.Fatalf("reasons %v, want %v", got, c.reasons)
			}
		})
	}
}
