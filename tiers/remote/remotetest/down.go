package remotetest

import (
	"errors"
	"testing"
	"time"

	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/tiers/remote"
)

// ServerDown is a remote tier whose server a test can stop and start.
type ServerDown struct {
	Tier  HealthyTier
	Stats func() remote.Stats
	// Stop makes the server unreachable; Restart brings it back with the
	// data it held.
	Stop, Restart func()
}

// RunServerDown checks what every remote tier does while its server is
// down: once transfers have failed unhealthy_after times the tier is
// down, and then lookups answer Miss and jobs fail as ErrUnavailable
// without touching the server (counted in the stats, no timing
// asserted), nothing is pending; after a restart the tier is healthy
// again by itself and the block stored before loads, and a new one
// stores.
func RunServerDown(t *testing.T, c ServerDown) {
	t.Helper()
	tier := c.Tier
	arena := NewArena(1024, 4)
	arena.Fill(0, 3)
	keys := Keys(0, 1)
	if res := Run(t, tier, StoreJob(1, arena, keys, []int64{0})); !res.Success {
		t.Fatal(res)
	}
	c.Stop()
	StoreUntilDown(t, tier, arena, 1, 2, 10*time.Second)

	req, _ := offload.NewReqContext("down", nil)
	for range 1000 {
		if r := tier.Lookup(keys[0], req); r != offload.Miss {
			t.Fatalf("lookup while down: %v", r)
		}
	}
	before := c.Stats()
	tier.SubmitStore(StoreJob(100, arena, keys, []int64{0}))
	tier.SubmitLoad(LoadJob(101, arena, keys, []int64{1}, req))
	for _, r := range WaitJobs(t, tier, 2, 10*time.Second) {
		if r.Success || !errors.Is(r.Err, remote.ErrUnavailable) {
			t.Fatalf("job while down: %+v", r)
		}
	}
	st := c.Stats()
	if st.Healthy || st.StoreJobsSkipped != before.StoreJobsSkipped+1 || st.LoadJobsSkipped != before.LoadJobsSkipped+1 ||
		st.LookupsUnhealthy < 1000 || st.Downs != 1 {
		t.Fatalf("stats while down %+v", st)
	}
	if tier.HasPendingWork() {
		t.Fatal("pending work while down and idle")
	}

	c.Restart()
	Eventually(t, 10*time.Second, "the tier healthy again", tier.Healthy)
	up, _ := offload.NewReqContext("up", nil)
	if r := Resolve(t, tier, keys[0], up); r != offload.Hit {
		t.Fatalf("lookup after the restart: %v", r)
	}
	if res := Run(t, tier, LoadJob(200, NewArena(1024, 1), keys, []int64{0}, up)); !res.Success {
		t.Fatalf("load after the restart: %+v", res)
	}
	if res := Run(t, tier, StoreJob(201, arena, Keys(200, 1), []int64{2})); !res.Success {
		t.Fatalf("store after the restart: %+v", res)
	}
}
