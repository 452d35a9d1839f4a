package workload

import (
	"context"
	"testing"
)

// TestNoisyNeighbour replays the trace prefix as one tenant while another
// floods the primary with blocks no one reads: without quotas the flood
// evicts the trace's blocks and its hit rate falls; with the trace's
// tenant guaranteed 90 % of the primary it loses no block to the flood,
// keeps ≥ 0.95 of its hit rate alone, and does at least as well as alone
// in a primary of its quota's size. (Hit rates, not timings: the replay
// is deterministic.)
func TestNoisyNeighbour(t *testing.T) {
	reqs := loadPrefix(t)
	const primary, quota = 1000, 900
	run := func(blocks int, n *Noise) *Result {
		t.Helper()
		r, err := Replay(context.Background(), Requests(reqs), Options{PrimaryBlocks: blocks, BlockBytes: 64, Noise: n})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	alone := run(primary, nil)
	aloneInQuota := run(quota, nil)
	for _, perRequest := range []int{8, 32} {
		free := run(primary, &Noise{BlocksPerRequest: perRequest})
		guarded := run(primary, &Noise{BlocksPerRequest: perRequest, TraceQuota: quota})
		t.Logf("%d noise blocks per request: hit rate alone %.4f, no quotas %.4f (%d trace blocks evicted by the noise), quota %d: %.4f (%d), alone in %d blocks %.4f",
			perRequest, alone.HitRate, free.HitRate, free.Noise.TraceEvictedByNoise, quota, guarded.HitRate, guarded.Noise.TraceEvictedByNoise, quota, aloneInQuota.HitRate)
		if free.Noise.TraceEvictedByNoise == 0 || free.HitRate >= alone.HitRate {
			t.Errorf("without quotas the flood cost the trace nothing: the benchmark measures nothing")
		}
		if guarded.Noise.TraceEvictedByNoise != 0 {
			t.Errorf("with a quota the flood evicted %d of the trace's blocks", guarded.Noise.TraceEvictedByNoise)
		}
		if guarded.HitRate < 0.95*alone.HitRate {
			t.Errorf("with a quota of %d of %d blocks the trace's hit rate is %.4f, under 0.95 × %.4f alone", quota, primary, guarded.HitRate, alone.HitRate)
		}
		if guarded.HitRate < aloneInQuota.HitRate {
			t.Errorf("with a quota of %d blocks the trace's hit rate %.4f is under its hit rate alone in %d blocks, %.4f", quota, guarded.HitRate, quota, aloneInQuota.HitRate)
		}
		if guarded.Noise.StoredBlocks == 0 {
			t.Error("the neighbour stored nothing")
		}
	}
}

func TestNoiseOptionErrors(t *testing.T) {
	for _, n := range []*Noise{{BlocksPerRequest: 0}, {BlocksPerRequest: 1, TraceQuota: -1}, {BlocksPerRequest: 1, TraceQuota: 11}} {
		if _, err := Replay(context.Background(), Requests(nil), Options{PrimaryBlocks: 10, BlockBytes: 64, Noise: n}); err == nil {
			t.Errorf("%+v accepted", *n)
		}
	}
	if _, err := Replay(context.Background(), Requests(nil), Options{PrimaryBlocks: 10, BlockBytes: 64, Timed: true, Noise: &Noise{BlocksPerRequest: 1}}); err == nil {
		t.Error("a timed replay with noise accepted")
	}
}
