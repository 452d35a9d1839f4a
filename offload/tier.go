package offload

import (
	"fmt"
	"strings"
)

// Medium is the coarse storage medium a tier declares (docs/semantics.md §1.2). The
// zero value is MediumUnspecified: the tier is dynamic on this axis and
// passes every matcher (it enforces the filter itself).
type Medium uint8

// Media.
const (
	MediumUnspecified Medium = iota
	MediumCPU
	MediumStorage
)

// numAxisValues is the number of valid values of Medium and of Locality,
// including unspecified.
const numAxisValues = 3

// String returns the wire name (CPU, STORAGE) or "" when unspecified.
func (m Medium) String() string {
	switch m {
	case MediumCPU:
		return "CPU"
	case MediumStorage:
		return "STORAGE"
	case MediumUnspecified:
		return ""
	}
	return fmt.Sprintf("Medium(%d)", uint8(m))
}

// ParseMedium maps a case-insensitive name (cpu, storage) to a Medium.
// Whitespace is not trimmed, as upstream.
func ParseMedium(s string) (Medium, bool) {
	switch strings.ToUpper(s) {
	case "CPU":
		return MediumCPU, true
	case "STORAGE":
		return MediumStorage, true
	}
	return MediumUnspecified, false
}

// Locality is the placement of a tier's storage relative to the publishing
// instance (docs/semantics.md §1.3). The zero value is LocalityUnspecified (dynamic).
type Locality uint8

// Localities.
const (
	LocalityUnspecified Locality = iota
	LocalityLocal
	LocalityRemote
)

// String returns the wire name (LOCAL, REMOTE) or "" when unspecified.
func (l Locality) String() string {
	switch l {
	case LocalityLocal:
		return "LOCAL"
	case LocalityRemote:
		return "REMOTE"
	case LocalityUnspecified:
		return ""
	}
	return fmt.Sprintf("Locality(%d)", uint8(l))
}

// ParseLocality maps a case-insensitive name to a Locality. "global" is
// accepted as a synonym of remote (the spelling of the design discussion).
func ParseLocality(s string) (Locality, bool) {
	switch strings.ToUpper(s) {
	case "LOCAL":
		return LocalityLocal, true
	case "REMOTE", "GLOBAL":
		return LocalityRemote, true
	}
	return LocalityUnspecified, false
}

// TierMatcher matches tiers by medium and locality (docs/semantics.md §1.4). An
// unspecified field matches anything; a tier whose own field is unspecified
// passes that axis of every matcher.
type TierMatcher struct {
	Medium   Medium
	Locality Locality
}

// Matches reports whether a tier declaring (medium, locality) matches m.
// A tier medium or locality outside the declared constants matches
// nothing: it cannot come from a valid tier declaration, and letting it
// through would make an unknown value behave like "dynamic".
func (m TierMatcher) Matches(medium Medium, locality Locality) bool {
	if medium >= numAxisValues || locality >= numAxisValues {
		return false
	}
	mediumOK := m.Medium == MediumUnspecified || medium == MediumUnspecified || m.Medium == medium
	localityOK := m.Locality == LocalityUnspecified || locality == LocalityUnspecified || m.Locality == locality
	return mediumOK && localityOK
}

// String renders m like a request entry, e.g. {medium:STORAGE,locality:LOCAL}.
func (m TierMatcher) String() string {
	var parts []string
	if m.Medium != MediumUnspecified {
		parts = append(parts, "medium:"+m.Medium.String())
	}
	if m.Locality != LocalityUnspecified {
		parts = append(parts, "locality:"+m.Locality.String())
	}
	return "{" + strings.Join(parts, ",") + "}"
}

// TierFilter is an OR of matchers (docs/semantics.md §1.5). The sentinel All allows
// every tier; a filter with no matchers denies every secondary tier. The
// answer for each of the 3×3 (medium, locality) combinations is computed
// once at construction, so Allows is a single bit test.
//
// A TierFilter is immutable after construction; share it by pointer. Build
// one with All or NewTierFilter; the zero TierFilter denies every tier.
type TierFilter struct {
	matchers []TierMatcher
	mask     uint16
	all      bool
}

// allFilter is the sentinel behind All. It is never mutated.
var allFilter = TierFilter{matchers: []TierMatcher{{}}, mask: maskOf([]TierMatcher{{}}), all: true}

// All returns the sentinel filter that allows every tier. It is equal in
// value to NewTierFilter(TierMatcher{}) but IsAll reports true only for it.
func All() *TierFilter { return &allFilter }

// NewTierFilter builds a filter from matchers (kept in order, duplicates
// included). No matchers means deny every secondary tier.
func NewTierFilter(matchers ...TierMatcher) *TierFilter {
	f := &TierFilter{matchers: append([]TierMatcher(nil), matchers...)}
	f.mask = maskOf(f.matchers)
	return f
}

// maskOf evaluates the matchers for every valid (medium, locality) pair.
func maskOf(matchers []TierMatcher) uint16 {
	var mask uint16
	for m := Medium(0); m < numAxisValues; m++ {
		for l := Locality(0); l < numAxisValues; l++ {
			for _, tm := range matchers {
				if tm.Matches(m, l) {
					mask |= 1 << bitIndex(m, l)
					break
				}
			}
		}
	}
	return mask
}

// bitIndex places (m, l) in the 16-bit mask with a stride of 4, so that
// each axis value below 4 has its own bit and value 3 (invalid) owns bits
// that are never set. Anything larger must not alias a valid pair: a
// medium >= 4 already indexes past bit 15, and the l&^3 term pushes a
// locality >= 4 past it too (a plain m*3+l would map (CPU, 3) onto
// (STORAGE, unspecified)). Shifting a uint16 by 16 or more yields 0.
func bitIndex(m Medium, l Locality) uint {
	return uint(m)<<2 | uint(l) | uint(l&^3)<<4
}

// Allows reports whether a tier declaring (medium, locality) may be used.
// It is a bit test without allocation; a nil filter means All. Values
// outside the declared constants are denied, even by All.
func (f *TierFilter) Allows(medium Medium, locality Locality) bool {
	mask := allFilter.mask
	if f != nil {
		mask = f.mask
	}
	return mask>>bitIndex(medium, locality)&1 != 0
}

// IsAll reports whether f is the All sentinel (identity, not value).
func (f *TierFilter) IsAll() bool { return f == nil || f.all }

// DeniesAll reports whether f allows no secondary tier at all.
func (f *TierFilter) DeniesAll() bool { return f != nil && f.mask == 0 }

// Matchers returns a copy of the matchers in order.
func (f *TierFilter) Matchers() []TierMatcher {
	if f == nil {
		return allFilter.Matchers()
	}
	return append([]TierMatcher(nil), f.matchers...)
}

// Match returns the first matcher that allows (medium, locality), for
// explanations. ok is false when none does.
func (f *TierFilter) Match(medium Medium, locality Locality) (m TierMatcher, ok bool) {
	if f == nil {
		f = &allFilter
	}
	for _, tm := range f.matchers {
		if tm.Matches(medium, locality) {
			return tm, true
		}
	}
	return TierMatcher{}, false
}

// Equal reports value equality: same matchers in the same order. All is
// equal to a filter holding one unconstrained matcher.
func (f *TierFilter) Equal(g *TierFilter) bool {
	if f == nil {
		f = &allFilter
	}
	if g == nil {
		g = &allFilter
	}
	if len(f.matchers) != len(g.matchers) {
		return false
	}
	for i := range f.matchers {
		if f.matchers[i] != g.matchers[i] {
			return false
		}
	}
	return true
}

// String renders f: "ALL", "[]" (deny all) or the matchers.
func (f *TierFilter) String() string {
	if f.IsAll() {
		return "ALL"
	}
	parts := make([]string, len(f.matchers))
	for i, m := range f.matchers {
		parts[i] = m.String()
	}
	return "[" + strings.Join(parts, " ") + "]"
}
