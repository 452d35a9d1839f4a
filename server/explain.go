package server

import (
	"github.com/kvtier/kvtier/explain"
	"github.com/kvtier/kvtier/offload"
)

// Explanation is package explain's explanation of a request against the
// namespace's live tiers (the same verdicts and reasons kvtier explain
// prints for a config), with what only the daemon knows: its validation
// mode and whether it would reject the request.
type Explanation struct {
	explain.Explanation
	Mode offload.ValidationMode
	// StrictError is the error a strict-mode server returns for the
	// request ("" when it would accept it).
	StrictError string
}

// Explain parses params with the namespace's defaults and explains the
// request with explain.Explain over the declarations of the manager's
// tiers. Nothing is registered and no warning is counted. Params that are
// not a JSON object are an error.
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
	decls := make([]explain.Declaration, len(tiers))
	details := map[string]explain.Details{}
	for i, t := range tiers {
		decls[i] = explain.DeclarationOf(t)
		details[decls[i].Name] = explain.DetailsOf(t)
	}
	ex.Explanation = explain.Explain(decls, &p, rc)
	ex.Explanation.AddDetails(details)
	return ex, nil
}
