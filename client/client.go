package client

import (
	"context"
	"crypto/tls"
	"fmt"
	"math"
	"net"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/experimental"

	kvtierv1 "github.com/kvtier/kvtier/api/kvtier/v1"
	"github.com/kvtier/kvtier/api/wire"
	"github.com/kvtier/kvtier/offload"
)

// DefaultMaxMessageBytes matches the daemon's default message limit.
const DefaultMaxMessageBytes = 64 << 20

// Options configure Dial.
type Options struct {
	// Token is sent as "authorization: Bearer <token>" (TCP daemons with
	// an auth token). It travels in clear text: use it on loopback or
	// inside a trusted network.
	Token string
	// Namespace is the daemon namespace to use ("" = default).
	Namespace string
	// MaxMessageBytes bounds messages in both directions (default
	// DefaultMaxMessageBytes); keep it at or below the daemon's limit.
	MaxMessageBytes int
	// TLS, if set, talks TLS to a daemon whose TCP API serves it
	// (server.tls); package tlsconfig builds it from PEM files.
	TLS *tls.Config
	// NoStream keeps PutBlocks and GetBlocks on the API even where the
	// daemon (over TCP) offers its block stream (Streams is nil then).
	NoStream bool
	// StreamTimeout bounds a block-stream dial and hello (default 5s).
	StreamTimeout time.Duration
	// MaxReconnectDelay caps the wait between attempts to reconnect to a
	// daemon that went away (default gRPC's: growing to 120s), so that a
	// daemon back after a long outage is reached as soon as after a short
	// one (the peer tier sets its probe_interval).
	MaxReconnectDelay time.Duration
}

// Client is a connection to a kvtier daemon.
type Client struct {
	conn     *grpc.ClientConn
	api      kvtierv1.KVTierClient
	ns       string
	unixPath string // "" for TCP
	streams  *StreamPool
}

// IsUnixTarget reports whether target names a Unix socket: "unix:PATH",
// "unix://PATH", or a path (it contains a slash or ends in ".sock").
func IsUnixTarget(target string) (path string, ok bool) {
	switch {
	case strings.HasPrefix(target, "unix://"):
		return strings.TrimPrefix(target, "unix://"), true
	case strings.HasPrefix(target, "unix:"):
		return strings.TrimPrefix(target, "unix:"), true
	case strings.Contains(target, "/"), strings.HasSuffix(target, ".sock"):
		return target, true
	}
	return "", false
}

// Dial connects to the daemon at target: a Unix socket (see IsUnixTarget)
// or a TCP host:port. The connection is made lazily; the first call fails
// if the daemon is not there.
func Dial(target string, opts Options) (*Client, error) {
	if opts.MaxMessageBytes <= 0 {
		opts.MaxMessageBytes = DefaultMaxMessageBytes
	}
	creds := insecure.NewCredentials()
	if opts.TLS != nil {
		creds = credentials.NewTLS(opts.TLS)
	}
	dopts := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(opts.MaxMessageBytes), grpc.MaxCallSendMsgSize(opts.MaxMessageBytes),
			grpc.ForceCodecV2(wire.Codec{})),
		experimental.WithBufferPool(wire.Pool),
		grpc.WithInitialWindowSize(wire.WindowSize),
		grpc.WithInitialConnWindowSize(wire.WindowSize),
		grpc.WithReadBufferSize(wire.IOBufferSize),
		grpc.WithWriteBufferSize(wire.IOBufferSize),
	}
	if opts.Token != "" {
		dopts = append(dopts, grpc.WithPerRPCCredentials(bearer(opts.Token)))
	}
	if d := opts.MaxReconnectDelay; d > 0 {
		b := backoff.DefaultConfig
		b.BaseDelay = min(b.BaseDelay, d)
		b.MaxDelay = d
		dopts = append(dopts, grpc.WithConnectParams(grpc.ConnectParams{Backoff: b, MinConnectTimeout: 20 * time.Second}))
	}
	c := &Client{ns: opts.Namespace}
	addr := target
	if _, ok := IsUnixTarget(target); !ok && !opts.NoStream {
		c.streams = newStreamPool(c, target, StreamOptions{Token: opts.Token, Namespace: opts.Namespace, TLS: opts.TLS, Timeout: opts.StreamTimeout}, nil)
	}
	if path, ok := IsUnixTarget(target); ok {
		c.unixPath = path
		addr = "passthrough:///unix"
		dopts = append(dopts, grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		}))
	} else {
		addr = "passthrough:///" + target
	}
	conn, err := grpc.NewClient(addr, dopts...)
	if err != nil {
		return nil, fmt.Errorf("kvtier client: dial %s: %w", target, err)
	}
	c.conn = conn
	c.api = kvtierv1.NewKVTierClient(conn)
	return c, nil
}

// bearer sends the token with every call. It does not require transport
// security because the daemon's TCP listener is plain text.
type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

func (bearer) RequireTransportSecurity() bool { return false }

// Close closes the connection (and any block-stream connections).
func (c *Client) Close() error {
	if c.streams != nil {
		c.streams.set.closeAll()
	}
	return c.conn.Close()
}

// API returns the generated client for calls this package does not wrap.
func (c *Client) API() kvtierv1.KVTierClient { return c.api }

// Namespace returns the namespace the client's calls name.
func (c *Client) Namespace() string { return c.ns }

// WithNamespace returns a client for another namespace sharing the
// connection (closing either closes both). Its by-value calls take block
// streams of their own, which name ns in their hello.
func (c *Client) WithNamespace(ns string) *Client {
	cc := *c
	cc.ns = ns
	if c.streams != nil {
		o := c.streams.opts
		o.Namespace = ns
		cc.streams = newStreamPool(&cc, c.streams.apiAddr, o, c.streams.set)
	}
	return &cc
}

// packKeys returns keys back to back when they all have one length (the
// cheap form for the daemon to decode), else ok is false.
func packKeys(keys []offload.Key) (packed []byte, size uint32, ok bool) {
	if len(keys) == 0 {
		return nil, 0, false
	}
	n := len(keys[0])
	for _, k := range keys {
		if len(k) != n {
			return nil, 0, false
		}
	}
	packed = make([]byte, 0, n*len(keys))
	for _, k := range keys {
		packed = append(packed, k...)
	}
	return packed, uint32(n), true
}

// keyFields fills the keys of a keyed request in the cheapest form.
func keyFields(keys []offload.Key) (raw [][]byte, packed []byte, size uint32) {
	if p, s, ok := packKeys(keys); ok {
		return nil, p, s
	}
	return keyBytes(keys), nil, 0
}

func keyBytes(keys []offload.Key) [][]byte {
	out := make([][]byte, len(keys))
	for i, k := range keys {
		out[i] = []byte(k)
	}
	return out
}

func toKeys(raw [][]byte) []offload.Key {
	if len(raw) == 0 {
		return nil
	}
	out := make([]offload.Key, len(raw))
	for i, b := range raw {
		out[i] = offload.Key(b)
	}
	return out
}

// NewRequest registers request id with its kv_transfer_params (a JSON
// object, or "" for none) and returns the filters as the daemon parsed
// them.
func (c *Client) NewRequest(ctx context.Context, id, params string) (*kvtierv1.NewRequestResponse, error) {
	return c.api.NewRequest(ctx, &kvtierv1.NewRequestRequest{Namespace: c.ns, RequestId: id, KvTransferParams: params})
}

// Lookup looks keys up for request id; with prefixScan the daemon scans
// like vLLM's connector (see LookupRequest.prefix_scan). It returns one
// result per key and the number of leading hits.
func (c *Client) Lookup(ctx context.Context, id string, keys []offload.Key, prefixScan bool) ([]kvtierv1.LookupResult, int, error) {
	raw, packed, size := keyFields(keys)
	resp, err := c.api.Lookup(ctx, &kvtierv1.LookupRequest{Namespace: c.ns, RequestId: id, Keys: raw, PackedKeys: packed, KeySize: size, PrefixScan: prefixScan})
	if err != nil {
		return nil, 0, err
	}
	return resp.GetResults(), int(resp.GetHits()), nil
}

// LookupSources looks every key up for request id (no prefix scan) and
// also returns where each block is: "primary", the secondary tier it is
// being promoted from, or "" (see LookupResponse.sources).
func (c *Client) LookupSources(ctx context.Context, id string, keys []offload.Key) ([]kvtierv1.LookupResult, []string, error) {
	raw, packed, size := keyFields(keys)
	resp, err := c.api.Lookup(ctx, &kvtierv1.LookupRequest{Namespace: c.ns, RequestId: id, Keys: raw, PackedKeys: packed, KeySize: size, WantSources: true})
	if err != nil {
		return nil, nil, err
	}
	return resp.GetResults(), resp.GetSources(), nil
}

// PrepareLoad pins keys and returns their arena slots (co-indexed). A key
// evicted since the Lookup that answered HIT (another client's stores)
// fails the call, which then pins nothing; PrepareLoadPresent answers it
// as a miss instead.
func (c *Client) PrepareLoad(ctx context.Context, id string, keys []offload.Key) ([]int64, error) {
	raw, packed, size := keyFields(keys)
	resp, err := c.api.PrepareLoad(ctx, &kvtierv1.PrepareLoadRequest{Namespace: c.ns, RequestId: id, Keys: raw, PackedKeys: packed, KeySize: size})
	if err != nil {
		return nil, err
	}
	return resp.GetSlots(), nil
}

// PrepareLoadPresent pins the keys still in the primary and returns their
// arena slots (co-indexed); a key evicted since the Lookup that answered
// HIT answers slot -1 (a miss: nothing to read, nothing to CompleteLoad),
// and missing counts those.
func (c *Client) PrepareLoadPresent(ctx context.Context, id string, keys []offload.Key) (slots []int64, missing int, err error) {
	raw, packed, size := keyFields(keys)
	resp, err := c.api.PrepareLoad(ctx, &kvtierv1.PrepareLoadRequest{Namespace: c.ns, RequestId: id, Keys: raw, PackedKeys: packed, KeySize: size, AllowMissing: true})
	if err != nil {
		return nil, 0, err
	}
	return resp.GetSlots(), int(resp.GetMissing()), nil
}

// CompleteLoad unpins keys pinned by PrepareLoad.
func (c *Client) CompleteLoad(ctx context.Context, id string, keys []offload.Key) error {
	raw, packed, size := keyFields(keys)
	_, err := c.api.CompleteLoad(ctx, &kvtierv1.CompleteLoadRequest{Namespace: c.ns, RequestId: id, Keys: raw, PackedKeys: packed, KeySize: size})
	return err
}

// Touch refreshes the recency of keys.
func (c *Client) Touch(ctx context.Context, id string, keys []offload.Key) error {
	raw, packed, size := keyFields(keys)
	_, err := c.api.Touch(ctx, &kvtierv1.TouchRequest{Namespace: c.ns, RequestId: id, Keys: raw, PackedKeys: packed, KeySize: size})
	return err
}

// Reservation is the answer of PrepareStore.
type Reservation struct {
	// OK is false when the primary could not make room (nothing reserved).
	OK bool
	// Keys are the keys to write, Slots[i] the slot of Keys[i].
	Keys    []offload.Key
	Slots   []int64
	Evicted []offload.Key
}

// PrepareStore reserves slots for keys; metadata is nil or one entry per
// key (token metadata for self-describing events).
func (c *Client) PrepareStore(ctx context.Context, id string, keys []offload.Key, metadata []*kvtierv1.BlockMetadata) (Reservation, error) {
	raw, packed, size := keyFields(keys)
	resp, err := c.api.PrepareStore(ctx, &kvtierv1.PrepareStoreRequest{Namespace: c.ns, RequestId: id, Keys: raw, PackedKeys: packed, KeySize: size, Metadata: metadata})
	if err != nil {
		return Reservation{}, err
	}
	return Reservation{OK: resp.GetOk(), Keys: toKeys(resp.GetKeysToStore()), Slots: resp.GetSlots(), Evicted: toKeys(resp.GetEvicted())}, nil
}

// CompleteStore commits (success) or abandons reserved slots.
func (c *Client) CompleteStore(ctx context.Context, id string, keys []offload.Key, success bool) error {
	raw, packed, size := keyFields(keys)
	_, err := c.api.CompleteStore(ctx, &kvtierv1.CompleteStoreRequest{Namespace: c.ns, RequestId: id, Keys: raw, PackedKeys: packed, KeySize: size, Success: success})
	return err
}

// FinishRequest ends request id.
func (c *Client) FinishRequest(ctx context.Context, id string) error {
	_, err := c.api.FinishRequest(ctx, &kvtierv1.FinishRequestRequest{Namespace: c.ns, RequestId: id})
	return err
}

// ScheduleEnd ends one engine step; pending reports transfers in flight.
func (c *Client) ScheduleEnd(ctx context.Context, newIDs, preemptedIDs []string) (pending bool, err error) {
	resp, err := c.api.ScheduleEnd(ctx, &kvtierv1.ScheduleEndRequest{Namespace: c.ns, NewRequestIds: newIDs, PreemptedRequestIds: preemptedIDs})
	if err != nil {
		return false, err
	}
	return resp.GetHasPendingWork(), nil
}

// Reset drops every block of the primary tier.
func (c *Client) Reset(ctx context.Context) error {
	_, err := c.api.Reset(ctx, &kvtierv1.ResetRequest{Namespace: c.ns})
	return err
}

// Stats returns the namespace's counters.
func (c *Client) Stats(ctx context.Context) (*kvtierv1.StatsResponse, error) {
	return c.api.Stats(ctx, &kvtierv1.StatsRequest{Namespace: c.ns})
}

// ListBlocks returns one page of the keys the primary holds from cursor on
// (0 starts a pass; the response's next_cursor is 0 after the last page)
// and where the namespace's KV events are published.
func (c *Client) ListBlocks(ctx context.Context, cursor int64, limit int) (*kvtierv1.ListBlocksResponse, error) {
	return c.api.ListBlocks(ctx, &kvtierv1.ListBlocksRequest{Namespace: c.ns, Cursor: cursor, Limit: int32(min(limit, math.MaxInt32))})
}

// Explain reports which tiers a request with params would use, and why.
func (c *Client) Explain(ctx context.Context, params string) (*kvtierv1.ExplainResponse, error) {
	return c.api.Explain(ctx, &kvtierv1.ExplainRequest{Namespace: c.ns, KvTransferParams: params})
}
