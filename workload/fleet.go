package workload

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"time"

	"github.com/kvtier/kvtier/config"
	"github.com/kvtier/kvtier/confvalue"
	"github.com/kvtier/kvtier/cpu"
	"github.com/kvtier/kvtier/offload"
)

// Routing policies of a fleet replay.
const (
	// RouteRoundRobin sends request i to node i mod N.
	RouteRoundRobin = "round-robin"
	// RouteRandom sends each request to a node drawn from the seed.
	RouteRandom = "random"
	// RoutePrefixAware sends each request to the node whose primary holds
	// the longest leading run of its blocks, as a KV-aware router indexing
	// the nodes' KV events does, with bounded load: a node that has served
	// more than (1 + LoadSlack) times its share of the requests so far is
	// passed over for the next best (ties: the least loaded). Without the
	// bound, a prefix every request shares (a system prompt) would send all
	// traffic to one node.
	RoutePrefixAware = "prefix-aware"
)

// LoadSlack is prefix-aware routing's bound on a node's load above the
// fleet's mean, as in consistent hashing with bounded loads.
const LoadSlack = 0.25

// FleetOptions configures a fleet replay.
type FleetOptions struct {
	// Options configure every node alike: its primary, the secondary
	// tiers of Options.Config (fs tiers each in a scratch directory of
	// their own), params, budget. Timed replay is not supported.
	Options
	// Nodes is the number of simulated nodes (default 1).
	Nodes int
	// Routing is RouteRoundRobin (default), RouteRandom or
	// RoutePrefixAware.
	Routing string
	// Seed drives RouteRandom: the same seed gives the same result.
	Seed uint64
	// Peers adds to every node a peer tier over the other nodes'
	// primaries (medium CPU, locality remote, read-only), behind its own
	// tiers: a model of kvtier's peer tier.
	Peers bool
	// SharedBlocks > 0 adds, behind the peers, one remote store of that
	// many blocks (LRU) that every node reads and cascades to: a model of
	// the fleet's shared Redis Cluster.
	SharedBlocks int
}

// FleetResult is what a fleet replay measured.
type FleetResult struct {
	Nodes        int    `json:"nodes"`
	Routing      string `json:"routing"`
	Seed         uint64 `json:"seed"`
	Peers        bool   `json:"peers"`
	SharedBlocks int    `json:"shared_blocks"`

	Requests  int     `json:"requests"`
	Blocks    uint64  `json:"blocks"`
	HitBlocks uint64  `json:"hit_blocks"`
	HitRate   float64 `json:"hit_rate"`
	// Split divides the hit blocks by where they came from; Rates are the
	// same as fractions of all blocks (their sum is HitRate).
	Split FleetSplit      `json:"split"`
	Rates FleetSplitRates `json:"rates"`
	// PerNode are the nodes' own replay results.
	PerNode []*Result     `json:"per_node"`
	Elapsed time.Duration `json:"elapsed_ns"`
}

// FleetSplit counts hit blocks by kind of source.
type FleetSplit struct {
	OwnDRAM   uint64 `json:"own_dram"`  // the node's primary
	OwnDisk   uint64 `json:"own_disk"`  // the node's fs tiers
	OwnOther  uint64 `json:"own_other"` // the node's other tiers (memory, s3, redis)
	Peer      uint64 `json:"peer"`      // another node's primary
	Shared    uint64 `json:"shared"`    // the shared remote store
	Unmatched uint64 `json:"unmatched"` // promoted hits no tier could be credited with
}

// FleetSplitRates is FleetSplit over all blocks.
type FleetSplitRates struct {
	OwnDRAM  float64 `json:"own_dram"`
	OwnDisk  float64 `json:"own_disk"`
	OwnOther float64 `json:"own_other"`
	Peer     float64 `json:"peer"`
	Shared   float64 `json:"shared"`
}

func (o FleetOptions) withDefaults() (FleetOptions, error) {
	if o.Nodes == 0 {
		o.Nodes = 1
	}
	if o.Routing == "" {
		o.Routing = RouteRoundRobin
	}
	opts, err := o.Options.withDefaults()
	if err != nil {
		return o, err
	}
	o.Options = opts
	switch {
	case o.Nodes < 1 || o.Nodes > 64:
		return o, fmt.Errorf("workload: %d nodes: want 1 to 64", o.Nodes)
	case o.Routing != RouteRoundRobin && o.Routing != RouteRandom && o.Routing != RoutePrefixAware:
		return o, fmt.Errorf("workload: routing %q: want %s, %s or %s", o.Routing, RouteRoundRobin, RouteRandom, RoutePrefixAware)
	case o.SharedBlocks < 0:
		return o, fmt.Errorf("workload: shared blocks %d: want >= 0", o.SharedBlocks)
	case o.Timed:
		return o, errors.New("workload: a fleet replay runs untimed")
	}
	return o, nil
}

// fleetNode is one simulated node: its stack and what the router knows of
// it.
type fleetNode struct {
	d       *driver
	primary *cpu.Primary
	// held is the router's index of the node's primary, fed by its KV
	// events (stored and removed).
	held   map[offload.Key]struct{}
	served int
}

// ReplayFleet replays src through o.Nodes nodes, routing each request to
// one of them, and reports the fleet's hit rate split by source. Requests
// run one after another (untimed), so the result depends only on the
// trace, the options and the seed.
func ReplayFleet(ctx context.Context, src Source, o FleetOptions) (*FleetResult, error) {
	o, err := o.withDefaults()
	if err != nil {
		return nil, err
	}
	base := config.Default()
	if o.Config != nil {
		c := *o.Config
		base = &c
	}
	base.Namespace.BytesPerBlock = confvalue.ByteSize(o.BlockBytes)

	var shared *sharedStore
	if o.SharedBlocks > 0 {
		shared = newSharedStore(o.SharedBlocks)
	}
	primaries := make([]*cpu.Primary, 0, o.Nodes)
	nodes := make([]*fleetNode, 0, o.Nodes)
	var scratch []string
	defer func() {
		for _, n := range nodes {
			_ = n.d.m.Close(context.WithoutCancel(ctx))
		}
		for _, d := range scratch {
			os.RemoveAll(d)
		}
	}()
	for i := range o.Nodes {
		cfg := *base
		dirs, _, err := freshTiers(&cfg)
		scratch = append(scratch, dirs...)
		if err != nil {
			return nil, err
		}
		n, err := newFleetNode(ctx, i, &cfg, o, &primaries, shared)
		if err != nil {
			return nil, fmt.Errorf("workload: node %d: %w", i, err)
		}
		primaries = append(primaries, n.primary)
		nodes = append(nodes, n)
	}

	rng := rand.New(rand.NewPCG(o.Seed, 0x6b767469657221)) // "kvtier!"
	start := time.Now()
	for seq := 0; ; seq++ {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("workload: fleet replay stopped after %d requests: %w", seq, err)
		}
		req, err := src.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("workload: after %d requests: %w", seq, err)
		}
		n := nodes[route(o.Routing, nodes, req, seq, rng)]
		n.served++
		if err := n.d.request(ctx, req); err != nil {
			return nil, fmt.Errorf("workload: request at trace line %d: %w", req.Line, err)
		}
	}
	res := &FleetResult{Nodes: o.Nodes, Routing: o.Routing, Seed: o.Seed, Peers: o.Peers, SharedBlocks: o.SharedBlocks}
	for _, n := range nodes {
		n.d.drain(ctx)
		n.d.collect()
		r := &n.d.res
		res.PerNode = append(res.PerNode, r)
		res.Requests += r.Requests
		res.Blocks += r.Blocks
		res.HitBlocks += r.HitBlocks
		res.Split.OwnDRAM += r.PrimaryHitBlocks
		credited := uint64(0)
		for _, t := range r.Tiers {
			credited += t.HitBlocks
			switch {
			case t.Type == "peer":
				res.Split.Peer += t.HitBlocks
			case t.Type == "shared":
				res.Split.Shared += t.HitBlocks
			case t.Type == "fs":
				res.Split.OwnDisk += t.HitBlocks
			default:
				res.Split.OwnOther += t.HitBlocks
			}
		}
		res.Split.Unmatched += r.PromotedHitBlocks - min(credited, r.PromotedHitBlocks)
	}
	res.Elapsed = time.Since(start)
	if res.Blocks > 0 {
		b := float64(res.Blocks)
		res.HitRate = float64(res.HitBlocks) / b
		res.Rates = FleetSplitRates{
			OwnDRAM: float64(res.Split.OwnDRAM) / b, OwnDisk: float64(res.Split.OwnDisk) / b,
			OwnOther: float64(res.Split.OwnOther) / b, Peer: float64(res.Split.Peer) / b, Shared: float64(res.Split.Shared) / b,
		}
	}
	return res, nil
}

func newFleetNode(ctx context.Context, i int, cfg *config.Config, o FleetOptions, primaries *[]*cpu.Primary, shared *sharedStore) (*fleetNode, error) {
	d, err := newNode(ctx, cfg, o.Options, nodeExtras{
		primaryEvents: true, // the router's index
		tiers: func() []offload.SecondaryTier {
			var extra []offload.SecondaryTier
			if o.Peers && o.Nodes > 1 {
				extra = append(extra, newPeerTier(i, primaries))
			}
			if shared != nil {
				extra = append(extra, newSharedView(shared))
			}
			return extra
		},
	})
	if err != nil {
		return nil, err
	}
	n := &fleetNode{d: d, primary: d.primary, held: make(map[offload.Key]struct{})}
	d.onEvents = n.index
	return n, nil
}

// index applies the node's primary events to the router's index.
func (n *fleetNode) index(evs []offload.Event) {
	for _, ev := range evs {
		if ev.Tier != "" {
			continue // a secondary tier's: the router routes by DRAM
		}
		for _, k := range ev.Keys {
			if ev.Removed {
				delete(n.held, k)
			} else {
				n.held[k] = struct{}{}
			}
		}
	}
}

// route picks the node for request number seq.
func route(policy string, nodes []*fleetNode, req Request, seq int, rng *rand.Rand) int {
	switch policy {
	case RouteRandom:
		return rng.IntN(len(nodes))
	case RoutePrefixAware:
		runs := make([]int, len(nodes))
		for i, n := range nodes {
			for _, id := range req.HashIDs {
				if _, ok := n.held[KeyOf(id)]; !ok {
					break
				}
				runs[i]++
			}
		}
		bound := int(math.Ceil((1 + LoadSlack) * float64(seq+1) / float64(len(nodes))))
		best := -1
		for i, n := range nodes {
			if n.served+1 > bound {
				continue
			}
			if best < 0 || runs[i] > runs[best] || (runs[i] == runs[best] && n.served < nodes[best].served) {
				best = i
			}
		}
		if best < 0 { // cannot happen: some node is at or below the mean
			best = seq % len(nodes)
		}
		return best
	}
	return seq % len(nodes)
}
