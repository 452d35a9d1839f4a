// Residency: which tiers hold a prefix, for routers and agents deciding
// where a request should go (issue 41). Nothing is promoted, pinned,
// touched, counted or published: a residency query leaves every tier as
// it found it.

package tiering

import (
	"github.com/kvtier/kvtier/offload"
)

// Holder is implemented by tiers that can tell from what they keep in
// memory — without I/O, and without changing recency, statistics or
// events — which of keys they hold: held[i] is set for each key held
// (and left as it was otherwise). A tier without it is reported unknown
// by residency queries rather than asked.
type Holder interface {
	Holds(keys []offload.Key, held []bool)
}

// TierResidency is one secondary tier's part of a residency answer.
type TierResidency struct {
	Name     string
	Medium   offload.Medium
	Locality offload.Locality
	// Allowed reports that the query's load filter allows the tier; a
	// tier it excludes is not asked (Run 0).
	Allowed bool
	// Known reports that the tier could answer (it is a Holder); an
	// allowed tier that cannot is not asked either (Run 0).
	Known bool
	// Run is the number of leading keys the tier holds.
	Run int
}

// Residency answers which tiers hold the leading keys of a prefix.
type Residency struct {
	// Primary is the number of leading keys ready in the primary (-1 in a
	// stack without one: vLLM tier mode, whose CPU tier is the engine's).
	Primary int
	// Tiers are the secondary tiers in lookup order.
	Tiers []TierResidency
	// Loadable is the number of leading keys each held by the primary or
	// by a tier the filter allows: what a request with this filter would
	// find, if nothing changed before it asked.
	Loadable int
}

// leadingRun counts the leading true values of held.
func leadingRun(held []bool) int {
	for i, h := range held {
		if !h {
			return i
		}
	}
	return len(held)
}

// Residency asks each tier that can tell which of keys it holds, those
// filter excludes left out. found is, per key, whether something before the
// stack (the primary) holds it; on return it is also set for every key an
// allowed tier holds. It returns the tiers' runs, in lookup order.
func (s *Stack) Residency(keys []offload.Key, filter *offload.TierFilter, found []bool) []TierResidency {
	out := make([]TierResidency, len(s.tiers))
	held := make([]bool, len(keys))
	for i, ts := range s.tiers {
		tr := &out[i]
		tr.Name, tr.Medium, tr.Locality = ts.name, ts.medium, ts.locality
		tr.Allowed = filter.Allows(ts.medium, ts.locality)
		h, ok := ts.t.(Holder)
		tr.Known = ok
		if !tr.Allowed || !ok {
			continue
		}
		clear(held)
		if !s.tierHolds(ts, h, keys, held) {
			tr.Known = false
			continue
		}
		tr.Run = leadingRun(held)
		for j, k := range held {
			found[j] = found[j] || k
		}
	}
	return out
}

// Residency answers which tiers hold the leading keys of a prefix for
// req's load filter (the primary is never filtered), changing nothing.
func (m *Manager) Residency(keys []offload.Key, req *offload.ReqContext) Residency {
	req = m.ctx(req)
	found := make([]bool, len(keys))
	for i, k := range keys {
		ref, ok := m.primary.RefCount(k)
		found[i] = ok && ref >= 0
	}
	r := Residency{Primary: leadingRun(found)}
	r.Tiers = m.stack.Residency(keys, req.LoadFilter, found)
	r.Loadable = leadingRun(found)
	return r
}

// ResidencyAlone answers as Manager.Residency does, for a stack with no
// primary before it (vLLM tier mode, whose CPU tier is the engine's and
// unknown here): Primary is -1 and Loadable counts the leading keys the
// allowed tiers hold.
func (s *Stack) ResidencyAlone(keys []offload.Key, filter *offload.TierFilter) Residency {
	found := make([]bool, len(keys))
	r := Residency{Primary: -1}
	r.Tiers = s.Residency(keys, filter, found)
	r.Loadable = leadingRun(found)
	return r
}
