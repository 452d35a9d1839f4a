package offload_test

import (
	"testing"

	"pgregory.net/rapid"

	"github.com/kvtier/kvtier/offload"
)

// TestAllowsMatchesProperty: for any matcher list, the precomputed
// Allows equals OR-ing Matches over the matchers for all 9 valid
// (medium, locality) pairs, equals the spec formula written out, and any
// out-of-range tier value is denied without panicking.
func TestAllowsMatchesProperty(t *testing.T) {
	// Matcher fields are drawn mostly from the valid values but sometimes
	// out of range, as a Go caller could construct them.
	genMatcher := rapid.Custom(func(t *rapid.T) offload.TierMatcher {
		return offload.TierMatcher{
			Medium:   offload.Medium(rapid.OneOf(rapid.IntRange(0, 2), rapid.IntRange(0, 255)).Draw(t, "matcherMedium")),
			Locality: offload.Locality(rapid.OneOf(rapid.IntRange(0, 2), rapid.IntRange(0, 255)).Draw(t, "matcherLocality")),
		}
	})
	rapid.Check(t, func(t *rapid.T) {
		matchers := rapid.SliceOfN(genMatcher, 0, 6).Draw(t, "matchers")
		f := offload.NewTierFilter(matchers...)
		for _, m := range media {
			for _, l := range localities {
				anyMatch := false
				for _, tm := range matchers {
					anyMatch = anyMatch || tm.Matches(m, l)
				}
				if got := f.Allows(m, l); got != anyMatch {
					t.Fatalf("Allows(%d,%d) = %v, any(Matches) = %v for %v", m, l, got, anyMatch, matchers)
				}
				if got, want := f.Allows(m, l), refAllows(matchers, m, l); got != want {
					t.Fatalf("Allows(%d,%d) = %v, spec formula %v for %v", m, l, got, want, matchers)
				}
				_, ok := f.Match(m, l)
				if ok != anyMatch {
					t.Fatalf("Match(%d,%d) ok = %v, want %v", m, l, ok, anyMatch)
				}
			}
		}
		m := offload.Medium(rapid.IntRange(0, 255).Draw(t, "tierMedium"))
		l := offload.Locality(rapid.IntRange(0, 255).Draw(t, "tierLocality"))
		if m > offload.MediumStorage || l > offload.LocalityRemote {
			for _, g := range []*offload.TierFilter{f, offload.All(), nil} {
				if g.Allows(m, l) {
					t.Fatalf("%v allows out-of-range (%d,%d)", g, m, l)
				}
			}
			for _, tm := range matchers {
				if tm.Matches(m, l) {
					t.Fatalf("%v matches out-of-range (%d,%d)", tm, m, l)
				}
			}
		}
		if f.DeniesAll() != (len(matchers) == 0 || !anyAllowed(f)) || f.IsAll() {
			t.Fatalf("DeniesAll %v IsAll %v for %v", f.DeniesAll(), f.IsAll(), matchers)
		}
	})
}

func anyAllowed(f *offload.TierFilter) bool {
	for _, m := range media {
		for _, l := range localities {
			if f.Allows(m, l) {
				return true
			}
		}
	}
	return false
}
