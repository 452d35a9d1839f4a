package server_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/filemapper"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/tiers/fs"
	"github.com/kvtier/kvtier/tiers/memory"
	"github.com/kvtier/kvtier/vfs"
	"github.com/kvtier/kvtier/vfs/vfstest"
)

// A flood of stores into a small primary in front of tiers far slower than
// the flood (issue 10: 106 of 300 steps were rejected while the pressure
// gauge and the dropped counter stayed at 0). No store may be rejected:
// the cascades that do not fit are dropped, queued ones give way to the
// engine's stores, and /metrics shows it all.
func TestFloodOfStoresNeverRejected(t *testing.T) {
	for _, tc := range []struct {
		name  string
		tiers func(t envT) []offload.SecondaryTier
	}{
		{"queued memory tier", func(t envT) []offload.SecondaryTier {
			m, err := memory.New(memory.Config{Name: "slow", Medium: offload.MediumStorage, Locality: offload.LocalityRemote,
				BlockLatency: 5 * time.Millisecond, Concurrency: 1})
			if err != nil {
				t.Fatal(err)
			}
			return []offload.SecondaryTier{m}
		}},
		{"unbounded memory tier", func(t envT) []offload.SecondaryTier {
			m, err := memory.New(memory.Config{Name: "slow", Medium: offload.MediumCPU, Locality: offload.LocalityRemote,
				Latency: 50 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			return []offload.SecondaryTier{m}
		}},
		{"slow fs tier", func(envT) []offload.SecondaryTier {
			slow := vfstest.NewInjector(vfs.OS(), func(op vfstest.Op, _ string) *vfstest.Fault {
				if op == vfstest.OpWrite {
					return &vfstest.Fault{Delay: 2 * time.Millisecond}
				}
				return nil
			})
			tier, err := fs.New(fs.Config{Name: "disk", RootDir: t.TempDir(), FS: slow, WriteThreads: 2, QueueDepth: 16,
				Namespace: filemapper.Namespace{ModelName: "flood", BlockBytes: slotSize}, Logger: quietLogger()})
			if err != nil {
				t.Fatal(err)
			}
			return []offload.SecondaryTier{tier}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := startEnv(t, envOptions{slots: 64, tiers: tc.tiers})
			ctx := ctxT(t)
			c := e.dial(t, e.unix)
			data := make([]byte, slotSize)
			const steps = 300
			for step := range steps {
				blocks := make([]client.Block, 4)
				for i := range blocks {
					blocks[i] = client.Block{Key: offload.MakeKey([]byte(fmt.Sprintf("flood-%d-%d", step, i)), 0), Data: data}
				}
				if _, err := c.PutBlocks(ctx, blocks, client.CallOptions{}); err != nil {
					t.Fatalf("step %d of %d: store rejected: %v", step, steps, err)
				}
				if _, err := c.ScheduleEnd(ctx, nil, nil); err != nil {
					t.Fatal(err)
				}
			}
			st, err := c.Stats(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if st.GetPrimary().GetStoresRejected() != 0 {
				t.Fatalf("%d stores rejected", st.GetPrimary().GetStoresRejected())
			}
			ts := st.GetTiers()[0]
			dropped := ts.GetCascadesDroppedByReason()
			t.Logf("cascades ok %d, dropped %v, pinned %d of %d", ts.GetCascadesOk(), dropped, st.GetCascadePinnedSlots(), st.GetCascadePinBudget())
			if ts.GetCascadesDropped() == 0 {
				t.Fatal("a tier far slower than the flood dropped no cascade")
			}
			body := scrape(t, e)
			var sum float64
			for _, r := range []string{"budget", "tier_budget", "cancelled", "queue_full", "pressure", "evicted"} {
				v, ok := metricValue(body, "kvtier_tier_cascades_dropped_total", `reason="`+r+`"`)
				if !ok {
					t.Fatalf("no kvtier_tier_cascades_dropped_total{reason=%q} in /metrics", r)
				}
				sum += v
				if uint64(v) != dropped[r] {
					t.Errorf("/metrics drops for %s: %v, Stats says %d", r, v, dropped[r])
				}
			}
			if sum == 0 {
				t.Error("/metrics shows no dropped cascade")
			}
			if v, ok := metricValue(body, "kvtier_cascade_pin_budget_slots"); !ok || v != 16 {
				t.Errorf("kvtier_cascade_pin_budget_slots = %v (present %v), want 16 (a quarter of 64)", v, ok)
			}
		})
	}
}
