// Calls for routers and agents that steer the cache rather than serve a
// request (issue 41): residency of a prefix in every tier.

package server

import (
	"context"
	"fmt"

	kvtierv1 "github.com/kvtier/kvtier/api/kvtier/v1"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/tiering"
)

// residencer is implemented by managers that answer residency queries
// (tiering.Manager).
type residencer interface {
	Residency(keys []offload.Key, req *offload.ReqContext) tiering.Residency
}

// Residency answers which tiers hold the leading keys of a prefix, for
// the load filter of params (nil: the namespace's default), changing
// nothing in any tier.
// The warnings are those of params under lenient validation.
func (ns *Namespace) Residency(keys []offload.Key, params []byte) (tiering.Residency, []offload.Warning, error) {
	if err := ns.checkParams(params); err != nil {
		return tiering.Residency{}, nil, err
	}
	if err := ns.lock(); err != nil {
		return tiering.Residency{}, nil, err
	}
	defer ns.mu.Unlock()
	r, ok := ns.mgr.(residencer)
	if !ok {
		return tiering.Residency{}, nil, fmt.Errorf("%w: namespace %q does not answer residency queries", ErrUnsupported, ns.name)
	}
	// Parsed as a request's would be, quietly: a query is not a request,
	// and its warnings go back to the caller, not to the daemon's log.
	p := ns.parser
	p.OnWarning = nil
	rc, err := p.NewReqContext("residency", params)
	if err != nil {
		return tiering.Residency{}, nil, fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	}
	return r.Residency(keys, rc), rc.Warnings, nil
}

func (sv *service) Residency(ctx context.Context, in *kvtierv1.ResidencyRequest) (*kvtierv1.ResidencyResponse, error) {
	ns, _, keys, err := sv.nsKeys(ctx, in, false)
	if err != nil {
		return nil, err
	}
	r, warnings, err := ns.Residency(keys, []byte(in.GetKvTransferParams()))
	if err != nil {
		return nil, toStatus(err)
	}
	out := &kvtierv1.ResidencyResponse{Primary: uint32(max(r.Primary, 0)), Loadable: uint32(r.Loadable), Warnings: warningsProto(warnings)}
	for _, t := range r.Tiers {
		out.Tiers = append(out.Tiers, &kvtierv1.TierResidency{
			Name: t.Name, Medium: kvtierv1.Medium(t.Medium), Locality: kvtierv1.Locality(t.Locality),
			Allowed: t.Allowed, Known: t.Known, Run: uint32(t.Run),
		})
	}
	return out, nil
}
