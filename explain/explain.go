package explain

import (
	"fmt"
	"strings"

	"github.com/kvtier/kvtier/offload"
)

// Explanation says which secondary tiers one request would load from and
// store to, and why. The primary tier always participates and is not in
// it.
type Explanation struct {
	Load, Store Side
	// Tiers in config order.
	Tiers []TierVerdict
	// Warnings lists every problem found in the request's filters (lenient
	// mode; a strict parser rejects the request instead).
	Warnings []offload.Warning
}

// Side describes the filter that gates one direction: loads (lookups and
// promotions) or stores (cascades).
type Side struct {
	Field      string // kv_load_tiers or kv_store_tiers
	DefaultKey string // default_load_tiers or default_store_tiers
	// Filter is the filter that applies; never nil.
	Filter *offload.TierFilter
	// FromRequest: the request sent the field (not absent, not null).
	FromRequest bool
	// HasDefault: the server configures a default for the field.
	HasDefault bool
	// FailedOpen: the request sent the field but no usable entry, so the
	// filter fell back to ALL (the warnings say why).
	FailedOpen bool
}

// Source says where the filter came from, in words.
func (s Side) Source() string {
	switch {
	case s.FailedOpen:
		return fmt.Sprintf("the request's %s had no valid entry, so it fell back to ALL (see warnings)", s.Field)
	case s.FromRequest:
		return fmt.Sprintf("from the request's %s", s.Field)
	case s.HasDefault:
		return fmt.Sprintf("the request omits %s: server default %s", s.Field, s.DefaultKey)
	}
	return fmt.Sprintf("the request omits %s and the server sets no %s", s.Field, s.DefaultKey)
}

// TierVerdict is the decision for one tier.
type TierVerdict struct {
	Declaration
	Load, Store Verdict
	// Parts are the decisions for the tier's parts (a peer tier's peers),
	// which the tier makes itself with the same filter.
	Parts []TierVerdict
}

// Verdict is whether the tier takes part in one direction, and why.
type Verdict struct {
	Allowed bool
	Reason  string
}

// Explain explains rc, a request context built by p (nil means the zero
// Parser: lenient, no server defaults), against the declared tiers.
func Explain(decls []Declaration, p *offload.Parser, rc *offload.ReqContext) Explanation {
	if p == nil {
		p = &offload.Parser{}
	}
	e := Explanation{
		Load:     side(offload.KeyLoadTiers, "default_load_tiers", rc.LoadFilter, rc.LoadFromRequest, p.DefaultLoad != nil, rc.Warnings),
		Store:    side(offload.KeyStoreTiers, "default_store_tiers", rc.StoreFilter, rc.StoreFromRequest, p.DefaultStore != nil, rc.Warnings),
		Tiers:    make([]TierVerdict, len(decls)),
		Warnings: rc.Warnings,
	}
	for i, d := range decls {
		e.Tiers[i] = TierVerdict{Declaration: d, Load: verdict(e.Load.Filter, d), Store: verdict(e.Store.Filter, d)}
	}
	return e
}

// AddDetails adds what some tiers declare beyond medium and locality
// (from DeclareDetails, by tier name): a read-only tier takes no stores,
// and the parts of a dynamic tier (a peer tier's peers) get decisions of
// their own, which the tier makes itself with the same filter.
func (e *Explanation) AddDetails(details map[string]Details) {
	for i := range e.Tiers {
		v := &e.Tiers[i]
		d, ok := details[v.Name]
		if !ok {
			continue
		}
		if d.ReadOnly {
			v.Store = Verdict{false, "read-only tier: takes no stores"}
		}
		for _, part := range d.Parts {
			v.Parts = append(v.Parts, TierVerdict{Declaration: part, Load: verdict(e.Load.Filter, part), Store: v.Store})
		}
	}
}

func side(field, defaultKey string, f *offload.TierFilter, fromRequest, hasDefault bool, warns []offload.Warning) Side {
	if f == nil {
		f = offload.All()
	}
	s := Side{Field: field, DefaultKey: defaultKey, Filter: f, FromRequest: fromRequest, HasDefault: hasDefault}
	if fromRequest && f.IsAll() {
		// ParseTierFilter returns the All sentinel for a request field only
		// when it is not a list or has no valid entry; both warn.
		for _, w := range warns {
			if w.Field == field {
				s.FailedOpen = true
				break
			}
		}
	}
	return s
}

// verdict decides with the filter's own Allows, exactly as the tiering
// manager does, and uses Match only to say why.
func verdict(f *offload.TierFilter, d Declaration) Verdict {
	allowed := f.Allows(d.Medium, d.Locality)
	switch {
	case f.IsAll():
		return Verdict{allowed, "filter is ALL: every tier"}
	case f.DeniesAll():
		return Verdict{allowed, "filter is []: no secondary tier"}
	}
	m, ok := f.Match(d.Medium, d.Locality)
	if !ok {
		return Verdict{allowed, fmt.Sprintf("no matcher matches %s/%s", d.MediumString(), d.LocalityString())}
	}
	reason := fmt.Sprintf("matcher %s matches", m)
	var dynamic []string
	if m.Medium != offload.MediumUnspecified && d.Medium == offload.MediumUnspecified {
		dynamic = append(dynamic, "medium")
	}
	if m.Locality != offload.LocalityUnspecified && d.Locality == offload.LocalityUnspecified {
		dynamic = append(dynamic, "locality")
	}
	if len(dynamic) > 0 {
		reason += fmt.Sprintf(" (the tier is dynamic on %s and applies the filter itself)", strings.Join(dynamic, " and "))
	}
	return Verdict{allowed, reason}
}

// LoadTiers returns the names of the tiers the request would load from,
// in config order.
func (e Explanation) LoadTiers() []string {
	return e.names(func(v TierVerdict) bool { return v.Load.Allowed })
}

// StoreTiers returns the names of the tiers the request would store to,
// in config order.
func (e Explanation) StoreTiers() []string {
	return e.names(func(v TierVerdict) bool { return v.Store.Allowed })
}

func (e Explanation) names(pick func(TierVerdict) bool) []string {
	out := []string{}
	for _, v := range e.Tiers {
		if pick(v) {
			out = append(out, v.Name)
		}
	}
	return out
}
