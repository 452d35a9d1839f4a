package main

import (
	"errors"

	"github.com/spf13/cobra"
)

func newBenchCmd() *cobra.Command {
	return &cobra.Command{
		Use:    "bench --trace FILE",
		Short:  "Replay a request trace through the tiers and report hit rates",
		Hidden: true, // until the replay driver lands
		Args:   cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			return errors.New("bench: not implemented yet")
		},
	}
}
