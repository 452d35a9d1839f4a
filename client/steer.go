package client

import (
	"context"
	"time"

	kvtierv1 "github.com/kvtier/kvtier/api/kvtier/v1"
	"github.com/kvtier/kvtier/offload"
)

// Residency answers how many leading keys of a prefix each tier holds,
// for the load filter of params (kv_transfer_params JSON; "" for the
// daemon's default), without promoting, pinning, touching or counting
// anything: for routers and agents choosing where a request goes.
func (c *Client) Residency(ctx context.Context, keys []offload.Key, params string) (*kvtierv1.ResidencyResponse, error) {
	raw, packed, size := keyFields(keys)
	return c.api.Residency(ctx, &kvtierv1.ResidencyRequest{Namespace: c.ns, Keys: raw, PackedKeys: packed, KeySize: size, KvTransferParams: params})
}

// Prefetch promotes the leading run of keys that params' load filter
// allows toward the daemon's primary, ahead of a request the caller
// knows is coming; the daemon keeps trying tiers that are not sure yet
// until deadline (0: the daemon's default, 10 s). Bounded by the
// operator's prefetch.share; idempotent.
func (c *Client) Prefetch(ctx context.Context, keys []offload.Key, params string, deadline time.Duration) (*kvtierv1.PrefetchResponse, error) {
	raw, packed, size := keyFields(keys)
	return c.api.Prefetch(ctx, &kvtierv1.PrefetchRequest{Namespace: c.ns, Keys: raw, PackedKeys: packed, KeySize: size,
		KvTransferParams: params, DeadlineMs: uint32(deadline.Milliseconds())})
}

// Pin keeps the keys' blocks that are ready in the daemon's primary there
// for ttl (pinning again extends it): for a system prompt, or a session
// that resumes soon. Keys not ready are answered missing (prefetch them
// first), keys over the operator's pins.share refused.
func (c *Client) Pin(ctx context.Context, keys []offload.Key, ttl time.Duration) (*kvtierv1.PinResponse, error) {
	raw, packed, size := keyFields(keys)
	return c.api.Pin(ctx, &kvtierv1.PinRequest{Namespace: c.ns, Keys: raw, PackedKeys: packed, KeySize: size, TtlMs: uint32(ttl.Milliseconds())})
}

// Unpin releases pins before their TTL and returns how many it released.
func (c *Client) Unpin(ctx context.Context, keys []offload.Key) (int, error) {
	raw, packed, size := keyFields(keys)
	resp, err := c.api.Unpin(ctx, &kvtierv1.UnpinRequest{Namespace: c.ns, Keys: raw, PackedKeys: packed, KeySize: size})
	if err != nil {
		return 0, err
	}
	return int(resp.GetUnpinned()), nil
}

// Delete removes the keys' blocks from the daemon's primary and from
// every tier that removes blocks on request, with removal events per
// medium; the daemon waits for its transfers in flight first.
func (c *Client) Delete(ctx context.Context, keys []offload.Key) (*kvtierv1.DeleteResponse, error) {
	raw, packed, size := keyFields(keys)
	return c.api.Delete(ctx, &kvtierv1.DeleteRequest{Namespace: c.ns, Keys: raw, PackedKeys: packed, KeySize: size})
}

// DeleteAll removes every block of a key space from the primary and from
// every tier that lists what it holds (fs, memory): with a tenant's token
// its own ("" or its name as tenant); with the admin's, tenant's.
func (c *Client) DeleteAll(ctx context.Context, tenant string) (*kvtierv1.DeleteResponse, error) {
	return c.api.Delete(ctx, &kvtierv1.DeleteRequest{Namespace: c.ns, All: true, Tenant: tenant})
}
