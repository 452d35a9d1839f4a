package workload

import (
	"context"
	"reflect"
	"testing"
)

func fleet(t *testing.T, reqs []Request, o FleetOptions) *FleetResult {
	t.Helper()
	res, err := ReplayFleet(context.Background(), Requests(reqs), o)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// One node without peers or shared store is the plain replay; the split
// adds up to the hit rate.
func TestFleetOfOneIsAReplay(t *testing.T) {
	reqs := loadPrefix(t)[:600]
	one := fleet(t, reqs, FleetOptions{Options: Options{PrimaryBlocks: 400, BlockBytes: 64}})
	plain, err := Replay(context.Background(), Requests(reqs), Options{PrimaryBlocks: 400, BlockBytes: 64})
	if err != nil {
		t.Fatal(err)
	}
	if one.HitBlocks != plain.HitBlocks || one.Blocks != plain.Blocks {
		t.Fatalf("fleet of one %d/%d hits, replay %d/%d", one.HitBlocks, one.Blocks, plain.HitBlocks, plain.Blocks)
	}
	s := one.Split
	if s.OwnDRAM+s.OwnDisk+s.OwnOther+s.Peer+s.Shared+s.Unmatched != one.HitBlocks {
		t.Fatalf("split %+v does not add up to %d hits", s, one.HitBlocks)
	}
}

// The same options and seed give the same result, for every policy.
func TestFleetReproducible(t *testing.T) {
	reqs := loadPrefix(t)[:500]
	for _, routing := range []string{RouteRoundRobin, RouteRandom, RoutePrefixAware} {
		o := FleetOptions{Options: Options{PrimaryBlocks: 150, BlockBytes: 64}, Nodes: 3, Routing: routing, Seed: 7, Peers: true, SharedBlocks: 200}
		a, b := fleet(t, reqs, o), fleet(t, reqs, o)
		a.Elapsed, b.Elapsed = 0, 0
		for i := range a.PerNode {
			a.PerNode[i].Elapsed, b.PerNode[i].Elapsed = 0, 0
			a.PerNode[i].RequestsPerSec, b.PerNode[i].RequestsPerSec = 0, 0
			a.PerNode[i].NsPerKey, b.PerNode[i].NsPerKey = 0, 0
		}
		if !reflect.DeepEqual(a.Split, b.Split) || a.HitBlocks != b.HitBlocks || a.Requests != 500 {
			t.Errorf("%s: two runs differ: %+v vs %+v", routing, a.Split, b.Split)
		}
	}
}

// The shape of what a fleet gains on the trace prefix: four nodes of 500
// blocks under round-robin lose hits against one node of 2 000; peer
// tiers and a shared store win hits back; prefix-aware routing keeps each
// prefix on one node (and, the trace's prefixes being shared by many
// conversations, sends most traffic there); nothing beats the single node
// of the fleet's total DRAM by more than noise.
func TestFleetShape(t *testing.T) {
	reqs := loadPrefix(t)
	opts := Options{PrimaryBlocks: 500, BlockBytes: 64}
	single := fleet(t, reqs, FleetOptions{Options: Options{PrimaryBlocks: 4 * 500, BlockBytes: 64}})
	rr := fleet(t, reqs, FleetOptions{Options: opts, Nodes: 4})
	rrPeers := fleet(t, reqs, FleetOptions{Options: opts, Nodes: 4, Peers: true})
	rrShared := fleet(t, reqs, FleetOptions{Options: opts, Nodes: 4, SharedBlocks: 2000})
	pa := fleet(t, reqs, FleetOptions{Options: opts, Nodes: 4, Routing: RoutePrefixAware})
	t.Logf("single of 2000 %.4f; 4 × 500: round-robin %.4f, +peers %.4f, +shared %.4f, prefix-aware %.4f",
		single.HitRate, rr.HitRate, rrPeers.HitRate, rrShared.HitRate, pa.HitRate)
	if rrPeers.HitRate <= rr.HitRate || rrPeers.Split.Peer == 0 {
		t.Errorf("peers added nothing: %.4f vs %.4f (%+v)", rrPeers.HitRate, rr.HitRate, rrPeers.Split)
	}
	if rrShared.HitRate <= rr.HitRate || rrShared.Split.Shared == 0 {
		t.Errorf("a shared store added nothing: %.4f vs %.4f (%+v)", rrShared.HitRate, rr.HitRate, rrShared.Split)
	}
	if pa.HitRate < rr.HitRate {
		t.Errorf("prefix-aware %.4f below round-robin %.4f", pa.HitRate, rr.HitRate)
	}
	for _, r := range []*FleetResult{rr, rrPeers, rrShared, pa} {
		if r.HitRate > single.HitRate+0.005 {
			t.Errorf("%s (peers %v, shared %d) %.4f beats one node of the fleet's DRAM %.4f", r.Routing, r.Peers, r.SharedBlocks, r.HitRate, single.HitRate)
		}
	}
}

func TestFleetOptionErrors(t *testing.T) {
	for _, o := range []FleetOptions{{Nodes: -1}, {Nodes: 65}, {Routing: "sticky"}, {SharedBlocks: -1}, {Options: Options{Timed: true}}} {
		if _, err := ReplayFleet(context.Background(), Requests(nil), o); err == nil {
			t.Errorf("%+v: no error", o)
		}
	}
}
