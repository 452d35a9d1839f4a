package client

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
)

// Region is an engine region registered with the daemon (vLLM tier mode;
// see RegionRegistration in the API). It lives until Close.
type Region struct {
	c         *Client
	conn      *net.UnixConn
	ID        string
	Namespace string
}

// RegisterRegion registers the region file f, laid out as layout (JSON
// marshalled), on the daemon's region socket (the client's Unix socket
// with ".region" appended).
func (c *Client) RegisterRegion(ctx context.Context, layout any, f *os.File) (*Region, error) {
	if c.unixPath == "" {
		return nil, errors.New("kvtier client: registering a region needs the daemon's Unix socket")
	}
	msg, err := json.Marshal(layout)
	if err != nil {
		return nil, err
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", c.unixPath+".region")
	if err != nil {
		return nil, fmt.Errorf("kvtier client: region socket: %w", err)
	}
	conn := nc.(*net.UnixConn)
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	if _, _, err := conn.WriteMsgUnix(msg, unix.UnixRights(int(f.Fd())), nil); err != nil {
		conn.Close()
		return nil, fmt.Errorf("kvtier client: send the region: %w", err)
	}
	line, err := bufio.NewReader(conn).ReadBytes('\n')
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("kvtier client: region registration: %w", err)
	}
	var rep struct {
		RegionID  string `json:"region_id"`
		Namespace string `json:"namespace"`
		Error     string `json:"error"`
	}
	if err := json.Unmarshal(line, &rep); err != nil || rep.Error != "" || rep.RegionID == "" {
		conn.Close()
		if rep.Error != "" {
			return nil, fmt.Errorf("kvtier client: region refused: %s", rep.Error)
		}
		return nil, fmt.Errorf("kvtier client: region registration answer %q: %v", line, err)
	}
	conn.SetDeadline(time.Time{})
	return &Region{c: c, conn: conn, ID: rep.RegionID, Namespace: rep.Namespace}, nil
}

// Close ends the registration and waits (bounded by ctx) until the daemon
// has unmapped the region: then no transfer touches it any more.
func (r *Region) Close(ctx context.Context) error {
	r.conn.CloseWrite()
	done := make(chan struct{})
	go func() { io.Copy(io.Discard, r.conn); close(done) }()
	defer r.conn.Close()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func packed(keys []offload.Key) ([]byte, uint32) {
	if len(keys) == 0 {
		return nil, 0
	}
	out := make([]byte, 0, len(keys)*len(keys[0]))
	for _, k := range keys {
		out = append(out, k...)
	}
	return out, uint32(len(keys[0]))
}

// Lookup asks which keys a tier request id may load from holds.
func (r *Region) Lookup(ctx context.Context, id, params string, keys []offload.Key) ([]kvtierv1.RegionFound, error) {
	p, size := packed(keys)
	resp, err := r.c.api.RegionLookup(ctx, &kvtierv1.RegionLookupRequest{RegionId: r.ID, RequestId: id, KvTransferParams: params, PackedKeys: p, KeySize: size})
	if err != nil {
		return nil, err
	}
	out := make([]kvtierv1.RegionFound, len(resp.GetFound()))
	for i, b := range resp.GetFound() {
		out[i] = kvtierv1.RegionFound(b)
	}
	return out, nil
}

// RegionLookup is one request's lookup in LookupMany.
type RegionLookup struct {
	RequestID string
	Params    string
	Keys      []offload.Key
}

// LookupMany asks the lookups of many requests in one call (an engine
// step's); the daemon puts them to the tiers at once. An entry the daemon
// could not answer has a nil answer and its reason in errs (co-indexed).
func (r *Region) LookupMany(ctx context.Context, lookups []RegionLookup) (found [][]kvtierv1.RegionFound, errs []error, err error) {
	in := &kvtierv1.RegionLookupsRequest{RegionId: r.ID, Lookups: make([]*kvtierv1.RegionLookupRequest, len(lookups))}
	for i, l := range lookups {
		p, size := packed(l.Keys)
		in.Lookups[i] = &kvtierv1.RegionLookupRequest{RequestId: l.RequestID, KvTransferParams: l.Params, PackedKeys: p, KeySize: size}
	}
	resp, err := r.c.api.RegionLookups(ctx, in)
	if err != nil {
		return nil, nil, err
	}
	if len(resp.GetLookups()) != len(lookups) {
		return nil, nil, fmt.Errorf("kvtier: %d answers to %d lookups", len(resp.GetLookups()), len(lookups))
	}
	found, errs = make([][]kvtierv1.RegionFound, len(lookups)), make([]error, len(lookups))
	for i, a := range resp.GetLookups() {
		if a.GetError() != "" {
			errs[i] = errors.New(a.GetError())
			continue
		}
		found[i] = make([]kvtierv1.RegionFound, len(a.GetFound()))
		for j, b := range a.GetFound() {
			found[i][j] = kvtierv1.RegionFound(b)
		}
	}
	return found, errs, nil
}

// RegionJob is a store or promotion job of the region's engine.
type RegionJob struct {
	ID        uint64
	RequestID string
	Params    string
	Keys      []offload.Key
	Slots     []int64
	Promotion bool
}

// Submit hands jobs to the daemon.
func (r *Region) Submit(ctx context.Context, jobs []RegionJob) error {
	in := &kvtierv1.RegionSubmitRequest{RegionId: r.ID}
	for _, j := range jobs {
		p, size := packed(j.Keys)
		in.Jobs = append(in.Jobs, &kvtierv1.RegionJob{JobId: j.ID, RequestId: j.RequestID, KvTransferParams: j.Params, Promotion: j.Promotion, PackedKeys: p, KeySize: size, Slots: j.Slots})
	}
	_, err := r.c.api.RegionSubmit(ctx, in)
	return err
}

// Results opens the stream of job outcomes.
func (r *Region) Results(ctx context.Context) (kvtierv1.KVTier_RegionResultsClient, error) {
	return r.c.api.RegionResults(ctx, &kvtierv1.RegionResultsRequest{RegionId: r.ID})
}

// Step ends an engine step and returns the tier events to publish.
func (r *Region) Step(ctx context.Context, finished []string) ([]*kvtierv1.RegionEvent, error) {
	resp, err := r.c.api.RegionStep(ctx, &kvtierv1.RegionStepRequest{RegionId: r.ID, FinishedRequestIds: finished})
	if err != nil {
		return nil, err
	}
	return resp.GetEvents(), nil
}
