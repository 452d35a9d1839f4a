package tierset_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/kvtier/kvtier/config"
	"github.com/kvtier/kvtier/cpu"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/tiering"
	"github.com/kvtier/kvtier/tierset"
)

// A burst of 2 000 stored blocks reaches a real fs tier whole, every
// time: a cascade the pin budget cannot take yet waits for it rather than
// being dropped (issue 40: 16-704 of 2 000 blocks lost in 4 of 9 runs).
// The budget is small (5 % of a primary that holds the whole burst) so
// that most cascades of the burst must wait.
func TestBurstReachesFSWhole(t *testing.T) {
	const (
		runs   = 20
		blocks = 2000
		batch  = 64
		slot   = 4 << 10
	)
	var deferred uint64
	for run := range runs {
		cfg, err := config.Parse(fmt.Appendf(nil, `
namespace: {model: it/model, bytes_per_block: %d}
primary: {bytes: %d}
secondary_tiers:
  - {name: disk, type: fs, root_dir: %q, fsync: none}
`, slot, 2048*slot, t.TempDir()))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		tiers, err := tierset.Build(ctx, cfg, tierset.Options{Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		p, err := cpu.New(cpu.Config{SlotSize: slot, Capacity: 2048 * slot})
		if err != nil {
			t.Fatal(err)
		}
		m, err := tiering.New(tiering.Config{Primary: p, Tiers: tiers, Budget: tiering.BudgetConfig{Fraction: 0.05}})
		if err != nil {
			t.Fatal(err)
		}
		req := offload.Background(fmt.Sprintf("burst-%d", run))
		m.OnNewRequest(req)
		for from := 0; from < blocks; from += batch {
			keys := make([]offload.Key, 0, batch)
			for i := from; i < min(from+batch, blocks); i++ {
				var b [8]byte
				binary.LittleEndian.PutUint64(b[:], uint64(run)<<32|uint64(i))
				keys = append(keys, offload.MakeKey(b[:], 0))
			}
			out, ok, err := m.PrepareStore(keys, req)
			if err != nil || !ok || len(out.KeysToStore) != len(keys) {
				t.Fatalf("run %d: PrepareStore: ok %v, err %v", run, ok, err)
			}
			for i, s := range out.Slots {
				b, _ := p.Arena().Slot(s)
				copy(b, out.KeysToStore[i])
			}
			if err := m.CompleteStore(out.KeysToStore, req, true); err != nil {
				t.Fatal(err)
			}
			m.ScheduleEnd(offload.ScheduleEnd{})
		}
		m.OnRequestFinished(req)
		// Steps until every cascade, deferred ones included, has ended.
		for m.HasPendingWork() || m.Stats().DeferredBlocks > 0 {
			if ctx.Err() != nil {
				t.Fatalf("run %d: cascades still in flight: %+v", run, m.Stats())
			}
			m.ScheduleEnd(offload.ScheduleEnd{})
			time.Sleep(time.Millisecond) // a step's model time; the wait is for the condition
		}
		st := m.Stats()
		ts := st.Tiers[0]
		deferred += ts.CascadesDeferred
		if ts.CascadedBlocks != blocks || ts.CascadesDropped != 0 || ts.CascadesFailed != 0 {
			t.Errorf("run %d: %d of %d blocks reached the fs tier (dropped %v, failed %d, deferred %d)", run, ts.CascadedBlocks, blocks, ts.DroppedBy, ts.CascadesFailed, ts.CascadesDeferred)
		}
		if err := m.Close(ctx); err != nil {
			t.Fatal(err)
		}
		cancel()
	}
	if deferred == 0 {
		t.Fatal("no cascade waited for the budget in any run: the test did not exercise deferral")
	}
	t.Logf("%d runs of %d blocks, all on disk; %d cascades waited for the budget", runs, blocks, deferred)
}
