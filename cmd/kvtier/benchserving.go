package main

import (
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
)

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
		Example: `  go run -tags charts ./cmd/kvtier bench plot-serving --out bench-out serving.json`,
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
