package server_test

import (
	"testing"
	"time"

	kvtierv1 "github.com/kvtier/kvtier/api/kvtier/v1"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/server"
	"github.com/kvtier/kvtier/tiers/memory"
)

// A block only a secondary tier holds, behind an existence check that
// answers a step later and a promotion that takes a millisecond: with the
// settle pass the engine's first step already answers HIT (the daemon
// asked again once the check and the promotion were done); without it
// the answer is "not sure yet" and the engine would ask a step later.
func TestEngineStepSettlesUnsureLookups(t *testing.T) {
	for _, tc := range []struct {
		name   string
		settle time.Duration
		want   byte
	}{
		{"settle", 30 * time.Second, byte(kvtierv1.RegionFound_REGION_FOUND_HIT)}, // bounded by the tier, not the budget
		{"no settle", -1, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := ctxT(t)
			sock, _ := startEngineDaemonWith(t, server.Limits{EngineLookupSettle: tc.settle}, func() ([]offload.SecondaryTier, error) {
				m, err := memory.New(memory.Config{Name: "disk", Medium: offload.MediumStorage, Locality: offload.LocalityLocal,
					Latency: time.Millisecond, AsyncLookup: true})
				return []offload.SecondaryTier{m}, err
			})
			c := dialEngine(t, sock)
			att, err := c.API().EngineAttach(ctx, &kvtierv1.EngineAttachRequest{Layout: engineLayout()})
			if err != nil {
				t.Fatal(err)
			}
			ns, epoch := att.GetNamespace(), att.GetEpoch()
			step := func(in *kvtierv1.EngineStepRequest) *kvtierv1.EngineStepResponse {
				t.Helper()
				in.Namespace, in.Epoch = ns, epoch
				out, err := c.API().EngineStep(ctx, in)
				if err != nil || len(out.GetWarnings()) > 0 {
					t.Fatalf("step: %v %v", out, err)
				}
				return out
			}
			// The block is stored, cascades to the tier, and the primary is
			// reset: only the tier holds it.
			k := offload.MakeKey([]byte("settle-block"), 0)
			packed, size := pack(k)
			r1 := step(&kvtierv1.EngineStepRequest{NewRequests: []*kvtierv1.EngineNewRequest{{RequestId: "w"}}, WantFreeSlots: 1})
			step(&kvtierv1.EngineStepRequest{
				Stores:             []*kvtierv1.EngineStore{{RequestId: "w", PackedKeys: packed, KeySize: size, Slots: r1.GetGrantedSlots()[:1], Success: true}},
				FinishedRequestIds: []string{"w"}})
			for deadline := time.Now().Add(time.Minute); ; {
				st, err := c.WithNamespace(ns).Stats(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if ts := st.GetTiers(); len(ts) == 1 && ts[0].GetCascadesOk() >= 1 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the block never reached the tier")
				}
				step(&kvtierv1.EngineStepRequest{}) // steps end the cascade
				time.Sleep(time.Millisecond)
			}
			step(&kvtierv1.EngineStepRequest{ResetCache: true})
			// The first lookup of a new request.
			r := step(&kvtierv1.EngineStepRequest{NewRequests: []*kvtierv1.EngineNewRequest{{RequestId: "r"}},
				Lookups: []*kvtierv1.EngineKeys{{RequestId: "r", PackedKeys: packed, KeySize: size}}})
			lk := r.GetLookups()[0]
			if got := lk.GetFound()[0]; got != tc.want {
				t.Fatalf("first answer %d, want %d (%v)", got, tc.want, lk)
			}
			if tc.want == byte(kvtierv1.RegionFound_REGION_FOUND_HIT) && len(lk.GetSlots()) != 1 {
				t.Fatalf("a HIT without its slot: %v", lk)
			}
		})
	}
}
