package server

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	kvtierv1 "github.com/kvtier/kvtier/api/kvtier/v1"
	"github.com/kvtier/kvtier/keyspace"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/region"
)

// The region socket (vLLM tier mode): see RegionRegistration in the
// .proto. One connection per registered region; the region lives as long
// as the connection.

// maxLayoutBytes bounds a registration message.
const maxLayoutBytes = 256 << 10

// registrationTimeout bounds the registration exchange (not the region's
// life).
const registrationTimeout = 10 * time.Second

type regionReply struct {
	RegionID  string `json:"region_id,omitempty"`
	Namespace string `json:"namespace,omitempty"`
	Error     string `json:"error,omitempty"`
}

// serveRegions accepts region registrations on ln until it is closed.
func (s *Server) serveRegions(ln *net.UnixListener) error {
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			return err
		}
		s.regionWG.Add(1)
		go func() {
			defer s.regionWG.Done()
			defer c.Close()
			s.holdRegion(c)
		}()
	}
}

// holdRegion registers the region c sends and keeps it until c closes (or
// the daemon stops), then closes it — waiting for its transfers — before
// closing c, so that the engine's end-of-file means "no transfer left".
func (s *Server) holdRegion(c *net.UnixConn) {
	c.SetDeadline(time.Now().Add(registrationTimeout))
	buf := make([]byte, maxLayoutBytes)
	oob := make([]byte, unix.CmsgSpace(4*4))
	n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
	answer := func(rep regionReply) {
		b, _ := json.Marshal(rep)
		c.Write(append(b, '\n'))
	}
	var files []*os.File
	if err == nil {
		files, err = parseRights(oob[:oobn])
	}
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	if err != nil {
		answer(regionReply{Error: fmt.Sprintf("read registration: %v", err)})
		return
	}
	if len(files) != 1 {
		answer(regionReply{Error: fmt.Sprintf("want the region file's descriptor in the message's ancillary data (SCM_RIGHTS), got %d descriptors", len(files))})
		return
	}
	l, err := region.ParseLayout(buf[:n])
	if err != nil {
		answer(regionReply{Error: err.Error()})
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), registrationTimeout)
	r, err := s.regions.Register(ctx, l, files[0])
	cancel()
	if err != nil {
		s.sideLogs.Warn(s.log, "region", "region registration refused", "err", err)
		answer(regionReply{Error: err.Error()})
		return
	}
	files[0].Close() // the mapping stays
	files = nil
	answer(regionReply{RegionID: r.ID(), Namespace: r.Namespace()})
	c.SetDeadline(time.Time{})
	// Hold until the engine closes (EOF, or an error) or the daemon stops.
	closed := make(chan struct{})
	go func() {
		io.Copy(io.Discard, bufio.NewReader(c))
		close(closed)
	}()
	select {
	case <-closed:
	case <-s.regionStop:
	}
	cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := r.Close(cctx); err != nil {
		s.log.Error("region close", "region", r.ID(), "err", err)
	}
	s.regionClaims.forget(r.ID())
}

// parseRights extracts the descriptors of SCM_RIGHTS messages.
func parseRights(oob []byte) ([]*os.File, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("ancillary data: %w", err)
	}
	var out []*os.File
	for _, m := range msgs {
		fds, err := unix.ParseUnixRights(&m)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			out = append(out, os.NewFile(uintptr(fd), "region"))
		}
	}
	return out, nil
}

// Tier mode and tenants. A region is registered on the region socket,
// which authenticates no one, so the first authenticated region call that
// names it claims it for its principal (the region id is 128 random bits
// only its registrant learns). A tenant's region then moves keys of the
// tenant's key space only — tagged on the way in, stripped from its
// events on the way out — and only that tenant and the admin may drive
// it; an admin's region sees no tenant's keys. Regions of one layout share
// their namespace's tiers, where the key spaces keep them apart.

// regionClaims records who drives each region.
type regionClaims struct {
	mu sync.Mutex
	m  map[string]principal
}

// claim returns the principal of region id, making it p if it has none.
func (rc *regionClaims) claim(id string, p principal) principal {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if owner, ok := rc.m[id]; ok {
		return owner
	}
	if rc.m == nil {
		rc.m = map[string]principal{}
	}
	rc.m[id] = p
	return p
}

func (rc *regionClaims) forget(id string) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	delete(rc.m, id)
}

// regionFor returns the region a call names and the key space its keys
// live in, or PERMISSION_DENIED for a tenant naming a region another
// principal drives.
func (sv *service) regionFor(ctx context.Context, id string) (*region.Region, keyspace.Space, error) {
	r, err := sv.regionOf(id)
	if err != nil {
		return nil, keyspace.Space{}, err
	}
	p := principalOf(ctx)
	owner := sv.s.regionClaims.claim(id, p)
	if p.t != nil && owner.t != p.t {
		p.t.ctr.refusals.Add(1)
		return nil, keyspace.Space{}, status.Errorf(codes.PermissionDenied, "tenant %q: region %s is driven by another principal", p.t.name, id)
	}
	if owner.t == nil {
		return r, keyspace.Space{}, nil
	}
	return r, owner.t.space, nil
}

// regionKeys decodes a region call's packed keys into key space sp.
func (sv *service) regionKeys(sp keyspace.Space, packed []byte, size uint32) ([]offload.Key, error) {
	return spaceKeys(sp, packed, size, sv.s.limits.MaxKeysPerCall)
}

// ownEvents keeps the events' keys of space sp (stripped of its tag); for
// the admin's untagged space, the keys of no configured tenant or shared
// space.
func (sv *service) ownEvents(sp keyspace.Space, ev []offload.Event) []offload.Event {
	if !sv.s.tenancy.on() {
		return ev
	}
	out := ev[:0:0]
	for _, e := range ev {
		keys := make([]offload.Key, 0, len(e.Keys))
		for _, k := range e.Keys {
			if sp.Tagged() {
				if raw, ok := sp.Strip(k); ok {
					keys = append(keys, raw)
				}
			} else if id, ok := keyspace.IDOf(k); !ok || sv.s.tenancy.spaceName(id) == "" {
				keys = append(keys, k)
			}
		}
		if len(keys) > 0 {
			e.Keys = keys
			out = append(out, e)
		}
	}
	return out
}

// regionOf returns the region a call names.
func (sv *service) regionOf(id string) (*region.Region, error) {
	if sv.s.regions == nil {
		return nil, toStatus(fmt.Errorf("%w: this daemon serves no vLLM tier mode (no region service)", ErrProtocol))
	}
	r, err := sv.s.regions.Region(id)
	if err != nil {
		return nil, regionStatus(err)
	}
	return r, nil
}

// regionStatus maps the region package's errors onto codes.
func regionStatus(err error) error {
	switch {
	case errors.Is(err, region.ErrUnknownRegion):
		return toStatus(fmt.Errorf("%w: %v", ErrUnknownNamespace, err))
	case errors.Is(err, region.ErrLayout):
		return toStatus(fmt.Errorf("%w: %v", ErrInvalidArgument, err))
	case errors.Is(err, region.ErrLimit):
		return toStatus(fmt.Errorf("%w: %v", ErrLimit, err))
	case errors.Is(err, region.ErrClosed):
		return toStatus(fmt.Errorf("%w: %v", ErrClosed, err))
	}
	return toStatus(err)
}

// packedKeys splits key_size-byte keys.
func packedKeys(packed []byte, size uint32, max int) ([]offload.Key, error) {
	if size == 0 {
		if len(packed) == 0 {
			return nil, nil
		}
		return nil, fmt.Errorf("%w: packed_keys without key_size", ErrInvalidArgument)
	}
	if len(packed)%int(size) != 0 {
		return nil, fmt.Errorf("%w: %d bytes of packed keys are not a multiple of key_size %d", ErrInvalidArgument, len(packed), size)
	}
	n := len(packed) / int(size)
	if n > max {
		return nil, fmt.Errorf("%w: %d keys in one call (max %d)", ErrLimit, n, max)
	}
	all := string(packed)
	keys := make([]offload.Key, n)
	for i := range keys {
		k := offload.Key(all[i*int(size) : (i+1)*int(size)])
		if !k.Valid() {
			return nil, fmt.Errorf("%w: keys[%d]", offload.ErrInvalidKey, i)
		}
		keys[i] = k
	}
	return keys, nil
}

func packKeys(keys []offload.Key) ([]byte, uint32) {
	if len(keys) == 0 {
		return nil, 0
	}
	size := len(keys[0])
	out := make([]byte, 0, size*len(keys))
	for _, k := range keys {
		if len(k) != size {
			return nil, 0 // never: a region's keys share the engine's hash size
		}
		out = append(out, k...)
	}
	return out, uint32(size)
}

func (sv *service) RegionLookup(ctx context.Context, in *kvtierv1.RegionLookupRequest) (*kvtierv1.RegionLookupResponse, error) {
	r, sp, err := sv.regionFor(ctx, in.GetRegionId())
	if err != nil {
		return nil, err
	}
	keys, err := sv.regionKeys(sp, in.GetPackedKeys(), in.GetKeySize())
	if err != nil {
		return nil, toStatus(err)
	}
	wait := time.Duration(in.GetWaitUs()) * time.Microsecond
	found, err := r.LookupWithin(ctx, in.GetRequestId(), []byte(in.GetKvTransferParams()), keys, wait)
	if err != nil {
		return nil, regionStatus(err)
	}
	return &kvtierv1.RegionLookupResponse{Found: foundBytes(found)}, nil
}

// foundBytes is a lookup's answer as the API sends it, a byte per key.
func foundBytes(found []region.Found) []byte {
	out := make([]byte, len(found))
	for i, f := range found {
		out[i] = byte(f)
	}
	return out
}

func (sv *service) RegionLookups(ctx context.Context, in *kvtierv1.RegionLookupsRequest) (*kvtierv1.RegionLookupsResponse, error) {
	r, sp, err := sv.regionFor(ctx, in.GetRegionId())
	if err != nil {
		return nil, err
	}
	entries := make([]region.LookupEntry, len(in.GetLookups()))
	total := 0
	for i, lk := range in.GetLookups() {
		keys, err := sv.regionKeys(sp, lk.GetPackedKeys(), lk.GetKeySize())
		if err != nil {
			return nil, toStatus(fmt.Errorf("lookups[%d]: %w", i, err))
		}
		if total += len(keys); total > sv.s.limits.MaxKeysPerCall {
			return nil, toStatus(fmt.Errorf("%w: %d keys in one call (max %d)", ErrLimit, total, sv.s.limits.MaxKeysPerCall))
		}
		entries[i] = region.LookupEntry{RequestID: lk.GetRequestId(), Params: []byte(lk.GetKvTransferParams()), Keys: keys}
	}
	answers, err := r.LookupMany(ctx, entries, 0)
	if err != nil {
		return nil, regionStatus(err)
	}
	out := &kvtierv1.RegionLookupsResponse{Lookups: make([]*kvtierv1.RegionLookupResponse, len(answers))}
	for i, a := range answers {
		if a.Err != nil {
			out.Lookups[i] = &kvtierv1.RegionLookupResponse{Error: a.Err.Error()}
			continue
		}
		out.Lookups[i] = &kvtierv1.RegionLookupResponse{Found: foundBytes(a.Found)}
	}
	return out, nil
}

func (sv *service) RegionSubmit(ctx context.Context, in *kvtierv1.RegionSubmitRequest) (*kvtierv1.RegionSubmitResponse, error) {
	r, sp, err := sv.regionFor(ctx, in.GetRegionId())
	if err != nil {
		return nil, err
	}
	jobs := make([]region.Job, len(in.GetJobs()))
	params := make([][]byte, len(jobs))
	total := 0
	for i, j := range in.GetJobs() {
		keys, err := sv.regionKeys(sp, j.GetPackedKeys(), j.GetKeySize())
		if err != nil {
			return nil, toStatus(fmt.Errorf("jobs[%d]: %w", i, err))
		}
		if total += len(keys); total > sv.s.limits.MaxKeysPerCall {
			return nil, toStatus(fmt.Errorf("%w: %d keys in one call (max %d)", ErrLimit, total, sv.s.limits.MaxKeysPerCall))
		}
		jobs[i] = region.Job{ID: j.GetJobId(), RequestID: j.GetRequestId(), Keys: keys, Slots: j.GetSlots(), Promotion: j.GetPromotion()}
		if p := j.GetKvTransferParams(); p != "" {
			params[i] = []byte(p)
		}
	}
	if err := r.Submit(ctx, jobs, params); err != nil {
		return nil, regionStatus(err)
	}
	return &kvtierv1.RegionSubmitResponse{}, nil
}

func (sv *service) RegionResults(in *kvtierv1.RegionResultsRequest, stream kvtierv1.KVTier_RegionResultsServer) error {
	r, _, err := sv.regionFor(stream.Context(), in.GetRegionId())
	if err != nil {
		return err
	}
	ctx := stream.Context()
	for {
		res, err := r.NextResults(ctx)
		if err != nil {
			return regionStatus(err)
		}
		out := &kvtierv1.RegionResultsResponse{Results: make([]*kvtierv1.RegionJobResult, len(res))}
		for i, x := range res {
			jr := &kvtierv1.RegionJobResult{JobId: x.JobID, Success: x.Success}
			for _, idx := range x.Loaded {
				jr.SuccessfulIndexes = append(jr.SuccessfulIndexes, uint32(idx))
			}
			out.Results[i] = jr
		}
		if err := stream.Send(out); err != nil {
			return err
		}
	}
}

func (sv *service) RegionStep(ctx context.Context, in *kvtierv1.RegionStepRequest) (*kvtierv1.RegionStepResponse, error) {
	r, sp, err := sv.regionFor(ctx, in.GetRegionId())
	if err != nil {
		return nil, err
	}
	if n := len(in.GetFinishedRequestIds()) + len(in.GetTouches()); n > sv.s.limits.MaxKeysPerCall {
		return nil, toStatus(fmt.Errorf("%w: %d entries in one step (max %d)", ErrLimit, n, sv.s.limits.MaxKeysPerCall))
	}
	touches := make([]region.Touch, len(in.GetTouches()))
	for i, t := range in.GetTouches() {
		keys, err := sv.regionKeys(sp, t.GetPackedKeys(), t.GetKeySize())
		if err != nil {
			return nil, toStatus(fmt.Errorf("touches[%d]: %w", i, err))
		}
		touches[i] = region.Touch{RequestID: t.GetRequestId(), Keys: keys}
	}
	ev, err := r.Step(ctx, in.GetFinishedRequestIds(), touches)
	if err != nil {
		return nil, regionStatus(err)
	}
	ev = sv.ownEvents(sp, ev)
	out := &kvtierv1.RegionStepResponse{Events: make([]*kvtierv1.RegionEvent, 0, len(ev))}
	for _, e := range ev {
		packed, size := packKeys(e.Keys)
		out.Events = append(out.Events, &kvtierv1.RegionEvent{
			PackedKeys: packed, KeySize: size, Medium: kvtierv1.Medium(e.Medium), Locality: kvtierv1.Locality(e.Locality),
			Removed: e.Removed, Tier: e.Tier,
		})
	}
	return out, nil
}

func (sv *service) RegionDrain(ctx context.Context, in *kvtierv1.RegionDrainRequest) (*kvtierv1.RegionDrainResponse, error) {
	r, _, err := sv.regionFor(ctx, in.GetRegionId())
	if err != nil {
		return nil, err
	}
	if ms := in.GetTimeoutMs(); ms > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(ms)*time.Millisecond)
		defer cancel()
	}
	if err := r.Drain(ctx); err != nil {
		return nil, regionStatus(err)
	}
	return &kvtierv1.RegionDrainResponse{}, nil
}

// regionStats answers Stats for a tier-mode namespace (by its name, as
// the region registration gave it): its tiers, no primary.
func (sv *service) regionStats(ctx context.Context, name string) (Stats, bool) {
	if sv.s.regions == nil {
		return Stats{}, false
	}
	for _, ns := range sv.s.regions.Stats(ctx) {
		if ns.Name != name {
			continue
		}
		return Stats{
			Namespace:      ns.Name,
			ActiveRequests: ns.Requests,
			Sessions:       ns.Regions,
			Tiers:          tierStatsOf(ns.Tiers, ns.TierObjects, int64(ns.RowStride)),
		}, true
	}
	return Stats{}, false
}
