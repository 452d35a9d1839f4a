//go:build charts

package main

// The charts of kvtier bench (--plot) and kvtier bench serving-plot, built
// only with -tags charts: the plotting library is some 37 packages the
// daemon has no use for, and the binary users run is the daemon's.

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"gonum.org/v1/plot/vg"

	"github.com/kvtier/kvtier/workload/plot"
)

// servingResults is the part of the serving benchmark's --json output
// (python/bench/serving.py) that the charts draw.
type servingResults struct {
	Runs []servingRun `json:"runs"`
}

type servingRun struct {
	Label    string    `json:"label"`
	Workload string    `json:"workload"`
	Error    string    `json:"error"`
	TTFTs    []float64 `json:"ttft_s"`
	// PromptTokens is the run's prompt tokens; HitTokens the ones a cache
	// served, by source (the engine's device cache, its CPU offload, a
	// disk tier, kvtier, ...).
	PromptTokens int64            `json:"prompt_tokens"`
	HitTokens    map[string]int64 `json:"hit_tokens"`
}

// writePlot draws rep to a PNG file.
func writePlot(name string, rep *benchReport) error {
	r := rep.Result
	pr := plot.Report{
		Title:       fmt.Sprintf("%d requests, primary %d blocks", r.Requests, r.Primary.Blocks),
		PrimaryOnly: rep.RefLRU,
		MaxHitRate:  rep.RefMax,
		Splits:      []plot.Split{{Label: "primary", Rate: rate(r.PrimaryHitBlocks, r.Blocks)}},
	}
	if rep.ConfigFile != "" {
		pr.Title += ", " + rep.ConfigFile
	}
	for _, t := range r.Tiers {
		pr.Splits = append(pr.Splits, plot.Split{Label: "from " + t.Name, Rate: rate(t.HitBlocks, r.Blocks)})
	}
	if n := r.UnattributedHitBlocks; n > 0 {
		pr.Splits = append(pr.Splits, plot.Split{Label: "promoted, tier not told apart", Rate: rate(n, r.Blocks)})
	}
	for _, p := range rep.Sweep {
		pr.Sweep = append(pr.Sweep, plot.Point{PrimaryBlocks: p.PrimaryBlocks, HitRate: p.HitRate, LRUHitRate: p.LRUHitRate})
	}
	width := 6 * vg.Inch
	if len(pr.Sweep) > 0 {
		width = 12 * vg.Inch
	}
	return writePNGFile(name, func(w io.Writer) error { return plot.WritePNG(w, pr, width, 4.5*vg.Inch) })
}

// writePNGFile creates the --plot file and draws into it; a chart that
// cannot be drawn leaves no file behind.
func writePNGFile(name string, draw func(io.Writer) error) (err error) {
	f, err := os.Create(name)
	if err != nil {
		return fmt.Errorf("--plot: %w", err)
	}
	defer func() {
		if cerr := f.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("--plot: %w", cerr)
		}
	}()
	if err := draw(f); err != nil {
		return errors.Join(fmt.Errorf("--plot %s: %w", name, err), os.Remove(name))
	}
	return nil
}

func writeFleetPlot(name string, rep *fleetReport) error {
	var bars []plot.Bar
	for _, r := range rep.Fleets {
		x := r.Rates
		bars = append(bars, plot.Bar{Label: r.Routing, Splits: []plot.Split{
			{Label: "own DRAM", Rate: x.OwnDRAM}, {Label: "own disk", Rate: x.OwnDisk}, {Label: "own other tiers", Rate: x.OwnOther},
			{Label: "peer", Rate: x.Peer}, {Label: "shared remote", Rate: x.Shared},
		}})
	}
	title := fmt.Sprintf("%d nodes × %d primary blocks, %d requests", rep.opts.Nodes, rep.opts.PrimaryBlocks, rep.Fleets[0].Requests)
	if rep.opts.Peers {
		title += ", peers"
	}
	if rep.opts.SharedBlocks > 0 {
		title += fmt.Sprintf(", shared %d", rep.opts.SharedBlocks)
	}
	width := vg.Length(max(5, 1.8*float64(len(bars)))) * vg.Inch
	return writePNGFile(name, func(w io.Writer) error { return plot.WriteFleetPNG(w, title, bars, rep.RefMax, width, 4*vg.Inch) })
}

// plotServing draws the charts of the results read from r into dir and
// returns the files written.
func plotServing(r io.Reader, dir string) ([]string, error) {
	var res servingResults
	if err := json.NewDecoder(r).Decode(&res); err != nil {
		return nil, fmt.Errorf("serving results: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	// Configurations in their first appearance's order, per workload.
	type agg struct {
		ttfts  []float64
		prompt int64
		hits   map[string]int64
	}
	var workloads []string
	labels := map[string][]string{}
	runs := map[string]map[string]*agg{}
	sources := map[string]bool{}
	for _, run := range res.Runs {
		if run.Error != "" || len(run.TTFTs) == 0 {
			continue
		}
		if runs[run.Workload] == nil {
			workloads = append(workloads, run.Workload)
			runs[run.Workload] = map[string]*agg{}
		}
		a := runs[run.Workload][run.Label]
		if a == nil {
			a = &agg{hits: map[string]int64{}}
			runs[run.Workload][run.Label] = a
			labels[run.Workload] = append(labels[run.Workload], run.Label)
		}
		a.ttfts = append(a.ttfts, run.TTFTs...)
		a.prompt += run.PromptTokens
		for s, n := range run.HitTokens {
			a.hits[s] += n
			sources[s] = true
		}
	}
	if len(workloads) == 0 {
		return nil, fmt.Errorf("serving results: no successful run to draw")
	}
	srcs := make([]string, 0, len(sources))
	for s := range sources {
		srcs = append(srcs, s)
	}
	sort.Slice(srcs, func(i, j int) bool {
		return sourceRank(srcs[i]) < sourceRank(srcs[j]) || sourceRank(srcs[i]) == sourceRank(srcs[j]) && srcs[i] < srcs[j]
	})
	var written []string
	for _, w := range workloads {
		var series []plot.Series
		var bars []plot.Bar
		for _, l := range labels[w] {
			a := runs[w][l]
			series = append(series, plot.Series{Label: l, Values: a.ttfts})
			b := plot.Bar{Label: l}
			for _, s := range srcs {
				share := 0.0
				if a.prompt > 0 {
					share = float64(a.hits[s]) / float64(a.prompt)
				}
				b.Splits = append(b.Splits, plot.Split{Label: s, Rate: share})
			}
			bars = append(bars, b)
		}
		ttft := filepath.Join(dir, "ttft-"+w+".png")
		if err := writePNGFile(ttft, func(f io.Writer) error {
			return plot.WriteCDFPNG(f, "time to first token, "+w, "TTFT (s)", series, 8*vg.Inch, 5*vg.Inch)
		}); err != nil {
			return written, err
		}
		written = append(written, ttft)
		hits := filepath.Join(dir, "hits-"+w+".png")
		width := vg.Length(2+1.3*float64(len(bars))) * vg.Inch
		if err := writePNGFile(hits, func(f io.Writer) error {
			return plot.WriteBarsPNG(f, plot.Bars{Title: "prompt tokens served from a cache, " + w, YLabel: "share of prompt tokens", Bars: bars, Format: "%.3f"}, width, 5*vg.Inch)
		}); err != nil {
			return written, err
		}
		written = append(written, hits)
	}
	return written, nil
}

// sourceRank orders hit sources from the engine outwards.
func sourceRank(s string) int {
	for i, x := range []string{"device", "host", "cpu", "disk", "kvtier"} {
		if strings.HasPrefix(s, x) {
			return i
		}
	}
	return 10
}
