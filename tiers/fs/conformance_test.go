package fs

import (
	"testing"

	rt "github.com/kvtier/kvtier/tiers/remote/remotetest"
)

// The tier conformance cases every tier passes (tiers/remote/remotetest):
// through the manager (store, promotion, the load and store filters) and
// a router's delete.
func TestConformanceThroughManager(t *testing.T) {
	rt.RunManager(t, rt.ManagerCase{Tier: newTier(t, t.TempDir(), nil), ExcludeLoad: `{"kv_load_tiers": [{"medium": "cpu"}]}`})
}

func TestConformanceDelete(t *testing.T) {
	rt.RunManagerDelete(t, rt.ManagerCase{Tier: newTier(t, t.TempDir(), nil)})
}

func TestConformanceDeleteWhere(t *testing.T) {
	rt.RunManagerDeleteWhere(t, rt.ManagerCase{Tier: newTier(t, t.TempDir(), nil)})
}
