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
	"time"

	"golang.org/x/sys/unix"

	kvtierv1 "github.com/kvtier/kvtier/api/kvtier/v1"
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
	r, err := sv.regionOf(in.GetRegionId())
	if err != nil {
		return nil, err
	}
	keys, err := packedKeys(in.GetPackedKeys(), in.GetKeySize(), sv.s.limits.MaxKeysPerCall)
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
	r, err := sv.regionOf(in.GetRegionId())
	if err != nil {
		return nil, err
	}
	entries := make([]region.LookupEntry, len(in.GetLookups()))
	total := 0
	for i, lk := range in.GetLookups() {
		keys, err := packedKeys(lk.GetPackedKeys(), lk.GetKeySize(), sv.s.limits.MaxKeysPerCall)
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
	r, err := sv.regionOf(in.GetRegionId())
	if err != nil {
		return nil, err
	}
	jobs := make([]region.Job, len(in.GetJobs()))
	params := make([][]byte, len(jobs))
	total := 0
	for i, j := range in.GetJobs() {
		keys, err := packedKeys(j.GetPackedKeys(), j.GetKeySize(), sv.s.limits.MaxKeysPerCall)
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
	r, err := sv.regionOf(in.GetRegionId())
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
	r, err := sv.regionOf(in.GetRegionId())
	if err != nil {
		return nil, err
	}
	if n := len(in.GetFinishedRequestIds()) + len(in.GetTouches()); n > sv.s.limits.MaxKeysPerCall {
		return nil, toStatus(fmt.Errorf("%w: %d entries in one step (max %d)", ErrLimit, n, sv.s.limits.MaxKeysPerCall))
	}
	touches := make([]region.Touch, len(in.GetTouches()))
	for i, t := range in.GetTouches() {
		keys, err := packedKeys(t.GetPackedKeys(), t.GetKeySize(), sv.s.limits.MaxKeysPerCall)
		if err != nil {
			return nil, toStatus(fmt.Errorf("touches[%d]: %w", i, err))
		}
		touches[i] = region.Touch{RequestID: t.GetRequestId(), Keys: keys}
	}
	ev, err := r.Step(ctx, in.GetFinishedRequestIds(), touches)
	if err != nil {
		return nil, regionStatus(err)
	}
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
	r, err := sv.regionOf(in.GetRegionId())
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
