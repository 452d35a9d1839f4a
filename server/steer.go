// Calls for routers and agents that steer the cache rather than serve a
// request (issue 41): residency of a prefix in every tier, prefetch, pins
// with a TTL, and deletes.

package server

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	kvtierv1 "github.com/kvtier/kvtier/api/kvtier/v1"
	"github.com/kvtier/kvtier/keyspace"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/region"
	"github.com/kvtier/kvtier/tiering"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// steerKeys opens the namespace of a router's call and returns its keys in
// the caller's key space. For the admin, "" names the daemon's only
// namespace (name is the call's namespace field, resolved in place);
// tenants resolve their own.
func (sv *service) steerKeys(ctx context.Context, in keyed, name *string) (*Namespace, []offload.Key, error) {
	if principalOf(ctx).t == nil {
		*name = sv.soleNamespace(*name)
	}
	ns, _, keys, err := sv.nsKeys(ctx, in, false)
	return ns, keys, err
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
	r := ns.mgr
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
	if out, ok, err := sv.regionResidency(ctx, in); ok {
		return out, err
	}
	ns, keys, err := sv.steerKeys(ctx, in, &in.Namespace)
	if err != nil {
		return nil, err
	}
	r, warnings, err := ns.Residency(keys, []byte(in.GetKvTransferParams()))
	if err != nil {
		return nil, toStatus(err)
	}
	return residencyProto(r, warnings), nil
}

// regionResidency answers a residency query that names a vLLM tier-mode
// namespace (ok false: the name is no such namespace, or one of the
// daemon's own). Its tiers are shared by the layout's engines, each
// principal's keys in its own key space, so any principal may ask, of
// its own space: a tenant's keys are tagged with its space and it learns
// of its own blocks only. The engine's CPU tier is vLLM's: Primary is not
// known (0 in the answer).
func (sv *service) regionResidency(ctx context.Context, in *kvtierv1.ResidencyRequest) (*kvtierv1.ResidencyResponse, bool, error) {
	name := in.GetNamespace()
	if sv.s.regions == nil || name == "" {
		return nil, false, nil
	}
	if _, err := sv.ns(name); err == nil {
		return nil, false, nil
	}
	var sp keyspace.Space
	if t := principalOf(ctx).t; t != nil {
		sp = t.space
	}
	keys, err := sv.s.limits.keysOf(in, sp)
	if err != nil {
		return nil, true, toStatus(err)
	}
	r, warnings, err := sv.s.regions.Residency(ctx, name, keys, []byte(in.GetKvTransferParams()))
	switch {
	case errors.Is(err, region.ErrNoNamespace):
		return nil, false, nil
	case err != nil:
		return nil, true, regionStatus(err)
	}
	return residencyProto(r, warnings), true, nil
}

// residencyProto is a residency answer as the API sends it.
func residencyProto(r tiering.Residency, warnings []offload.Warning) *kvtierv1.ResidencyResponse {
	out := &kvtierv1.ResidencyResponse{Primary: uint32(max(r.Primary, 0)), Loadable: uint32(r.Loadable), Warnings: warningsProto(warnings)}
	for _, t := range r.Tiers {
		out.Tiers = append(out.Tiers, &kvtierv1.TierResidency{
			Name: t.Name, Medium: kvtierv1.Medium(t.Medium), Locality: kvtierv1.Locality(t.Locality),
			Allowed: t.Allowed, Known: t.Known, Run: uint32(t.Run),
		})
	}
	return out
}

// DefaultPrefetchDeadline is a prefetch's deadline when the call names
// none.
const DefaultPrefetchDeadline = 10 * time.Second

// Prefetch promotes the leading run of keys that the load filter of
// params allows toward the primary, for up to wait (0: the default,
// bounded by Limits.MaxWait).
func (ns *Namespace) Prefetch(keys []offload.Key, params []byte, wait time.Duration) (tiering.PrefetchAnswer, []offload.Warning, error) {
	if err := ns.checkParams(params); err != nil {
		return tiering.PrefetchAnswer{}, nil, err
	}
	if wait <= 0 {
		wait = DefaultPrefetchDeadline
	}
	wait = min(wait, ns.limits.MaxWait)
	if err := ns.lock(); err != nil {
		return tiering.PrefetchAnswer{}, nil, err
	}
	defer ns.mu.Unlock()
	pf := ns.mgr
	p := ns.parser
	p.OnWarning = nil
	ns.prefetches++
	rc, err := p.NewReqContext("prefetch#"+strconv.FormatUint(ns.prefetches, 10), params)
	if err != nil {
		return tiering.PrefetchAnswer{}, nil, fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	}
	a, err := pf.Prefetch(keys, rc, time.Now().Add(wait))
	switch {
	case errors.Is(err, tiering.ErrPrefetchRefused):
		return a, nil, fmt.Errorf("%w: %w", ErrLimit, err)
	case errors.Is(err, tiering.ErrClosed):
		return a, nil, fmt.Errorf("%w: %w", ErrClosed, err)
	case err != nil:
		return a, nil, err
	}
	return a, rc.Warnings, nil
}

func (sv *service) Prefetch(ctx context.Context, in *kvtierv1.PrefetchRequest) (*kvtierv1.PrefetchResponse, error) {
	ns, keys, err := sv.steerKeys(ctx, in, &in.Namespace)
	if err != nil {
		return nil, err
	}
	a, warnings, err := ns.Prefetch(keys, []byte(in.GetKvTransferParams()), time.Duration(in.GetDeadlineMs())*time.Millisecond)
	if err != nil {
		return nil, toStatus(err)
	}
	return &kvtierv1.PrefetchResponse{Present: uint32(a.Present), Started: uint32(a.Started), Queued: a.Queued, Warnings: warningsProto(warnings)}, nil
}

// MaxPinTTL bounds a pin's TTL: a pin is a lease, not a way to own the
// primary.
const MaxPinTTL = 24 * time.Hour

// Pin keeps keys' blocks that are ready in the primary there for ttl.
// Keys over their owner's budget are answered as refused, not as an
// error (the others are pinned); pins off is one.
func (ns *Namespace) Pin(keys []offload.Key, ttl time.Duration, room func() (int, func())) (tiering.PinAnswer, error) {
	if ttl <= 0 || ttl > MaxPinTTL {
		return tiering.PinAnswer{}, fmt.Errorf("%w: pin TTL %v (want 1ms to %v)", ErrInvalidArgument, ttl, MaxPinTTL)
	}
	if err := ns.lock(); err != nil {
		return tiering.PinAnswer{}, err
	}
	defer ns.mu.Unlock()
	refused := 0
	if room != nil {
		// At most n keys not pinned yet: the caller's other unevictable
		// slots leave no more (holds.go); extensions always go.
		n, done := room()
		defer done()
		if n >= 0 {
			kept := keys[:0:0]
			for _, k := range keys {
				if _, pinned := ns.mgr.Pinned(k); !pinned {
					if n == 0 {
						refused++
						continue
					}
					n--
				}
				kept = append(kept, k)
			}
			keys = kept
		}
	}
	a, err := ns.mgr.Pin(keys, ttl)
	a.Refused += refused
	switch {
	case errors.Is(err, tiering.ErrPinRefused):
		return a, fmt.Errorf("%w: %w", ErrLimit, err)
	case errors.Is(err, tiering.ErrClosed):
		return a, fmt.Errorf("%w: %w", ErrClosed, err)
	}
	return a, err
}

// Unpin releases keys' pins and returns how many it released.
func (ns *Namespace) Unpin(keys []offload.Key) (int, error) {
	if err := ns.lock(); err != nil {
		return 0, err
	}
	defer ns.mu.Unlock()
	return ns.mgr.Unpin(keys), nil
}

func (sv *service) Pin(ctx context.Context, in *kvtierv1.PinRequest) (*kvtierv1.PinResponse, error) {
	ns, keys, err := sv.steerKeys(ctx, in, &in.Namespace)
	if err != nil {
		return nil, err
	}
	var room func() (int, func())
	if t := principalOf(ctx).t; t != nil {
		room = func() (int, func()) { return sv.s.pinRoom(ns, t) }
	}
	a, err := ns.Pin(keys, time.Duration(in.GetTtlMs())*time.Millisecond, room)
	if err != nil {
		return nil, toStatus(err)
	}
	return &kvtierv1.PinResponse{Pinned: uint32(a.Pinned), Missing: uint32(a.Missing), Refused: uint32(a.Refused)}, nil
}

func (sv *service) Unpin(ctx context.Context, in *kvtierv1.UnpinRequest) (*kvtierv1.UnpinResponse, error) {
	ns, keys, err := sv.steerKeys(ctx, in, &in.Namespace)
	if err != nil {
		return nil, err
	}
	n, err := ns.Unpin(keys)
	if err != nil {
		return nil, toStatus(err)
	}
	return &kvtierv1.UnpinResponse{Unpinned: uint32(n)}, nil
}

// Delete removes keys' blocks from the primary and from every tier that
// removes blocks on request, and publishes the removals.
func (ns *Namespace) Delete(ctx context.Context, keys []offload.Key) (tiering.DeleteAnswer, error) {
	if err := ns.lock(); err != nil {
		return tiering.DeleteAnswer{}, err
	}
	defer ns.mu.Unlock()
	a, err := ns.mgr.Delete(ctx, keys)
	if errors.Is(err, tiering.ErrClosed) {
		return a, fmt.Errorf("%w: %w", ErrClosed, err)
	}
	if err != nil {
		return a, err
	}
	ns.countDeletedLocked(a)
	ns.log.Info("blocks deleted", "namespace", ns.name, "keys", len(keys), "primary", a.Primary, "held", a.Held)
	ns.publishLocked()
	return a, nil
}

func (sv *service) Delete(ctx context.Context, in *kvtierv1.DeleteRequest) (*kvtierv1.DeleteResponse, error) {
	var a tiering.DeleteAnswer
	if in.GetAll() {
		var err error
		if a, err = sv.deleteSpace(ctx, in); err != nil {
			return nil, err
		}
	} else {
		ns, keys, err := sv.steerKeys(ctx, in, &in.Namespace)
		if err != nil {
			return nil, err
		}
		if in.GetTenant() != "" {
			return nil, status.Error(codes.InvalidArgument, "tenant names the key space of a delete of all its blocks (all: true), not of keys")
		}
		if a, err = ns.Delete(ctx, keys); err != nil {
			return nil, toStatus(err)
		}
	}
	out := &kvtierv1.DeleteResponse{Primary: uint32(a.Primary), Held: uint32(a.Held)}
	for _, t := range a.Tiers {
		r := &kvtierv1.TierDeleteResult{Name: t.Name, Supported: t.Supported, Removed: uint32(t.Removed)}
		if t.Err != nil {
			r.Error = t.Err.Error()
		}
		out.Tiers = append(out.Tiers, r)
	}
	return out, nil
}

// deleteSpace deletes every block of one key space (DeleteRequest.all): a
// tenant's own (or, in a shared space's namespace, the shared space's), or
// for the admin the named tenant's.
func (sv *service) deleteSpace(ctx context.Context, in *kvtierv1.DeleteRequest) (tiering.DeleteAnswer, error) {
	if len(in.GetKeys()) > 0 || len(in.GetPackedKeys()) > 0 {
		return tiering.DeleteAnswer{}, status.Error(codes.InvalidArgument, "all deletes a whole key space: name no keys")
	}
	p := principalOf(ctx)
	name := in.GetNamespace()
	if p.t == nil {
		name = sv.soleNamespace(name)
	}
	ns, sc, err := sv.open(ctx, name)
	if err != nil {
		return tiering.DeleteAnswer{}, err
	}
	sp := sc.keys
	switch {
	case p.t != nil && in.GetTenant() != "" && in.GetTenant() != p.t.name:
		p.t.ctr.refusals.Add(1)
		return tiering.DeleteAnswer{}, status.Errorf(codes.PermissionDenied, "tenant %q may delete its own blocks only", p.t.name)
	case p.t == nil && in.GetTenant() == "":
		return tiering.DeleteAnswer{}, status.Error(codes.InvalidArgument, "the admin's delete of all blocks names the tenant whose blocks go (tenant); the daemon's own blocks go with Reset and the tiers' own tools")
	case p.t == nil:
		t := sv.s.tenancy.byName(in.GetTenant())
		if t == nil {
			return tiering.DeleteAnswer{}, status.Errorf(codes.NotFound, "no tenant %q", in.GetTenant())
		}
		sp = t.space
	}
	if !sp.Tagged() {
		return tiering.DeleteAnswer{}, status.Error(codes.InvalidArgument, "all: the namespace's own key space cannot be deleted whole")
	}
	a, err := ns.DeleteSpace(ctx, sp)
	if err != nil {
		return a, toStatus(err)
	}
	return a, nil
}

// DeleteSpace deletes every block of key space sp from the primary and
// from every tier that can list what it holds.
func (ns *Namespace) DeleteSpace(ctx context.Context, sp keyspace.Space) (tiering.DeleteAnswer, error) {
	if err := ns.lock(); err != nil {
		return tiering.DeleteAnswer{}, err
	}
	defer ns.mu.Unlock()
	a, listed, err := ns.mgr.DeleteWhere(ctx, func(k offload.Key) bool {
		_, ok := sp.Strip(k)
		return ok
	})
	if errors.Is(err, tiering.ErrClosed) {
		return a, fmt.Errorf("%w: %w", ErrClosed, err)
	}
	if err != nil {
		return a, err
	}
	ns.countDeletedLocked(a)
	ns.log.Info("key space deleted", "namespace", ns.name, "space", fmt.Sprintf("%016x", sp.ID()), "keys", listed, "primary", a.Primary, "held", a.Held)
	ns.publishLocked()
	return a, nil
}

// countDeletedLocked counts a delete's blocks per tier and logs a tier's
// failure.
func (ns *Namespace) countDeletedLocked(a tiering.DeleteAnswer) {
	if ns.deleted == nil {
		ns.deleted = map[string]uint64{}
	}
	ns.deleted[tiering.PrimaryName] += uint64(a.Primary)
	for _, t := range a.Tiers {
		ns.deleted[t.Name] += uint64(t.Removed)
		if t.Err != nil {
			ns.log.Warn("delete: a tier failed", "namespace", ns.name, "tier", t.Name, "err", t.Err)
		}
	}
}
