package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/kvtier/kvtier/workload"
)

// fleetMode reports whether the flags ask for a fleet replay.
func (f benchFlags) fleetMode() bool { return f.nodes > 1 || f.peers || f.sharedBlocks > 0 }

// fleetReport is what a fleet bench measured: one replay per routing
// policy of --routing.
type fleetReport struct {
	Trace  string                  `json:"trace"`
	Config string                  `json:"config,omitempty"`
	RefMax float64                 `json:"reference_max_hit_rate"`
	Fleets []*workload.FleetResult `json:"fleets"`
	opts   workload.FleetOptions
}

// benchFleet runs the fleet replays of f over reqs with the per-node
// options opts.
func benchFleet(ctx context.Context, f benchFlags, reqs []workload.Request, opts workload.Options) (*fleetReport, error) {
	switch {
	case f.timed:
		return nil, errors.New("--nodes, --peers and --shared-blocks run untimed: drop --timed")
	case f.plotSizes != "":
		return nil, errors.New("--plot-sizes sweeps one node's primary: not with --nodes")
	case f.nodes < 1:
		return nil, fmt.Errorf("--nodes %d: want >= 1", f.nodes)
	}
	opts.FreshTiers = true // every node gets its own scratch fs directories
	rep := &fleetReport{Trace: f.trace, Config: f.config, RefMax: workload.ReferenceHitRate(reqs, 0)}
	for _, policy := range strings.Split(f.routing, ",") {
		fo := workload.FleetOptions{Options: opts, Nodes: f.nodes, Routing: strings.TrimSpace(policy), Seed: f.seed, Peers: f.peers, SharedBlocks: f.sharedBlocks}
		res, err := workload.ReplayFleet(ctx, workload.Requests(reqs), fo)
		if err != nil {
			return nil, err
		}
		rep.Fleets = append(rep.Fleets, res)
		rep.opts = fo
	}
	if f.plot != "" {
		if err := writeFleetPlot(f.plot, rep); err != nil {
			return nil, err
		}
	}
	return rep, nil
}

func fleetLabel(r *workload.FleetResult) string {
	l := r.Routing
	if r.Peers {
		l += " +peers"
	}
	if r.SharedBlocks > 0 {
		l += " +shared"
	}
	return l
}

func writeFleetText(w io.Writer, rep *fleetReport) error {
	o := rep.opts
	fmt.Fprintf(w, "trace %s: %d requests on %d nodes of %d primary blocks", rep.Trace, rep.Fleets[0].Requests, o.Nodes, o.PrimaryBlocks)
	if rep.Config != "" {
		fmt.Fprintf(w, ", tiers of %s on each", rep.Config)
	}
	if o.Peers {
		fmt.Fprint(w, ", peer tiers")
	}
	if o.SharedBlocks > 0 {
		fmt.Fprintf(w, ", a shared store of %d blocks", o.SharedBlocks)
	}
	fmt.Fprintf(w, "\nmaximum (unbounded single cache) %.4f\n\n", rep.RefMax)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "routing\thit rate\town DRAM\town disk\town other\tpeer\tshared\t")
	for _, r := range rep.Fleets {
		x := r.Rates
		fmt.Fprintf(tw, "%s\t%.4f\t%.4f\t%.4f\t%.4f\t%.4f\t%.4f\t\n", fleetLabel(r), r.HitRate, x.OwnDRAM, x.OwnDisk, x.OwnOther, x.Peer, x.Shared)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, r := range rep.Fleets {
		fmt.Fprintf(w, "\n%s, requests per node:", fleetLabel(r))
		for _, n := range r.PerNode {
			fmt.Fprintf(w, " %d", n.Requests)
		}
	}
	_, err := fmt.Fprintln(w)
	return err
}

func writeFleetJSON(w io.Writer, rep *fleetReport, err error) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err != nil {
		_ = enc.Encode(map[string]string{"error": err.Error()})
		return err
	}
	return enc.Encode(rep)
}
