package memory

import (
	"testing"

	"github.com/kvtier/kvtier/offload"
	rt "github.com/kvtier/kvtier/tiers/remote/remotetest"
)

func conformanceTier(t *testing.T) *Tier {
	t.Helper()
	tier, err := New(Config{Name: "dram", Medium: offload.MediumCPU, Locality: offload.LocalityRemote})
	if err != nil {
		t.Fatal(err)
	}
	return tier
}

// The tier conformance cases every tier passes (tiers/remote/remotetest):
// through the manager (store, promotion, the load and store filters) and
// a router's delete.
func TestConformanceThroughManager(t *testing.T) {
	rt.RunManager(t, rt.ManagerCase{Tier: conformanceTier(t), ExcludeLoad: `{"kv_load_tiers": [{"medium": "storage"}]}`})
}

func TestConformanceDelete(t *testing.T) {
	rt.RunManagerDelete(t, rt.ManagerCase{Tier: conformanceTier(t)})
}

func TestConformanceDeleteWhere(t *testing.T) {
	rt.RunManagerDeleteWhere(t, rt.ManagerCase{Tier: conformanceTier(t)})
}
