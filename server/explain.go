package server

import (
	"fmt"

	"github.com/kvtier/kvtier/offload"
)

// Explanation says which secondary tiers a request would load from and
// store to, and why.
type Explanation struct {
	Load, Store                       *offload.TierFilter
	LoadFromRequest, StoreFromRequest bool
	Warnings                          []offload.Warning
	Mode                              offload.ValidationMode
	// StrictError is the error a strict-mode server returns for the
	// request ("" when it would accept it).
	StrictError string
	Tiers       []TierDecision
}

// TierDecision is the verdict for one tier.
type TierDecision struct {
	Name, Type              string
	Medium                  offload.Medium
	Locality                offload.Locality
	Load, Store             bool
	LoadReason, StoreReason string
}

// Explain parses params with the namespace's defaults and reports the
// decision for every secondary tier. Nothing is registered and no warning
// is counted. Params that are not a JSON object are an error.
func (ns *Namespace) Explain(params []byte) (Explanation, error) {
	if err := ns.checkParams(params); err != nil {
		return Explanation{}, err
	}
	if err := ns.lock(); err != nil {
		return Explanation{}, err
	}
	tiers := ns.mgr.Tiers()
	p := ns.parser
	ns.mu.Unlock()

	ex := Explanation{Mode: p.Mode}
	p.OnWarning = nil
	if p.Mode == offload.Strict {
		if _, err := p.NewReqContext("explain", params); err != nil {
			ex.StrictError = err.Error()
		}
		p.Mode = offload.Lenient
	}
	rc, err := p.NewReqContext("explain", params)
	if err != nil {
		return Explanation{}, err
	}
	ex.Load, ex.Store = rc.LoadFilter, rc.StoreFilter
	ex.LoadFromRequest, ex.StoreFromRequest = rc.LoadFromRequest, rc.StoreFromRequest
	ex.Warnings = rc.Warnings
	for _, t := range tiers {
		d := TierDecision{Name: t.Name(), Type: t.Type(), Medium: t.Medium(), Locality: t.Locality()}
		d.Load, d.LoadReason = decide(rc.LoadFilter, rc.LoadFromRequest, offload.KeyLoadTiers, d.Medium, d.Locality)
		d.Store, d.StoreReason = decide(rc.StoreFilter, rc.StoreFromRequest, offload.KeyStoreTiers, d.Medium, d.Locality)
		ex.Tiers = append(ex.Tiers, d)
	}
	return ex, nil
}

// decide explains f's verdict for a tier declaring (m, l).
func decide(f *offload.TierFilter, fromRequest bool, field string, m offload.Medium, l offload.Locality) (bool, string) {
	source := field
	if !fromRequest {
		source = "server default for " + field
	}
	if f.IsAll() {
		return true, fmt.Sprintf("%s is ALL", source)
	}
	if f.DeniesAll() {
		return false, fmt.Sprintf("%s %s denies every secondary tier", source, f)
	}
	if m == offload.MediumUnspecified || l == offload.LocalityUnspecified {
		// A dynamic tier passes the undeclared axis of every matcher and
		// applies the filter itself, per peer.
		if mt, ok := f.Match(m, l); ok {
			return true, fmt.Sprintf("tier is dynamic (applies %s itself); %s matches its declared axes", source, mt)
		}
	}
	if mt, ok := f.Match(m, l); ok {
		return true, fmt.Sprintf("%s: matcher %s matches", source, mt)
	}
	return false, fmt.Sprintf("%s %s: no matcher allows medium %s, locality %s", source, f, orDynamic(m.String()), orDynamic(l.String()))
}

func orDynamic(s string) string {
	if s == "" {
		return "dynamic"
	}
	return s
}
