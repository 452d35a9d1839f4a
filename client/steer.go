package client

import (
	"context"

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
