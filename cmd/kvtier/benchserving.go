package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/spf13/cobra"
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

func newBenchPlotServingCmd() *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "plot-serving RESULTS.json|-",
		Short: "Draw the serving benchmark's charts from its --json results",
		Long: `plot-serving reads the --json results of the serving benchmark
(scripts/serving-bench.sh) and writes, for each workload, a CDF of time to
first token per configuration (ttft-WORKLOAD.png) and the share of prompt
tokens each cache served, by source (hits-WORKLOAD.png), into --out.
Rounds of the same configuration are merged.`,
		Example: `  kvtier bench plot-serving --out bench-out serving.json`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var in io.Reader = cmd.InOrStdin()
			if args[0] != "-" {
				f, err := os.Open(args[0])
				if err != nil {
					return err
				}
				defer f.Close()
				in = f
			}
			names, err := plotServing(in, out)
			for _, n := range names {
				fmt.Fprintln(cmd.OutOrStdout(), n)
			}
			return err
		},
	}
	cmd.Flags().StringVar(&out, "out", ".", "directory for the PNG files")
	return cmd
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
