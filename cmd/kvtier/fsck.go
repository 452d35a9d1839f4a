package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/kvtier/kvtier/config"
	"github.com/kvtier/kvtier/confvalue"
	"github.com/kvtier/kvtier/dirlock"
	"github.com/kvtier/kvtier/tiers/fs"
	"github.com/kvtier/kvtier/tierset"
)

func newFsckCmd() *cobra.Command {
	var configPath, tierName string
	var repair, progress bool
	cmd := &cobra.Command{
		Use:   "fsck --config FILE [--tier NAME] [--repair]",
		Short: "Check an fs tier's block files offline",
		Long: `fsck walks the directory of each fs tier of the config (or only --tier
NAME) while no daemon uses it, reads every block file in full and verifies it
as a load would (size, trailer, checksum in format kvtier; size in format
vllm). It lists corrupt files (a load would delete them), stray files (temp
files of interrupted writes, names the layout never produces) and foreign
files (vLLM's own or another block size: left alone). --repair removes the
corrupt and stray files. A tier a running daemon holds is reported and
skipped. A progress line is shown on a terminal.

Exit 0 when every file is good (or was repaired), 1 when problems remain or
a tier could not be checked.`,
		Example: `  kvtier fsck --config kvtier.yaml
  kvtier fsck --config kvtier.yaml --tier local-disk --repair`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if configPath == "" {
				return errors.New("fsck: --config is required (the daemon's configuration names the fs tiers)")
			}
			cfg, err := config.Load(configPath)
			if err != nil {
				return err
			}
			tiers, err := tierset.FSTiers(cfg)
			if err != nil {
				return err
			}
			if tierName != "" {
				var names []string
				found := false
				for _, t := range tiers {
					names = append(names, t.Name)
					if t.Name == tierName {
						tiers, found = []fs.Config{t}, true
						break
					}
				}
				if !found {
					return fmt.Errorf("fsck: --tier %q: %s has no fs tier of that name (fs tiers: %s)", tierName, configPath, strings.Join(names, ", "))
				}
			}
			if len(tiers) == 0 {
				return fmt.Errorf("fsck: %s declares no fs tier", configPath)
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			w, errw := cmd.OutOrStdout(), cmd.ErrOrStderr()
			bad := false
			for _, tc := range tiers {
				if !fsckTier(ctx, w, errw, tc, repair, progress) {
					bad = true
				}
			}
			if bad {
				return &exitError{code: 1}
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&configPath, "config", "", "the daemon's configuration file")
	fl.StringVar(&tierName, "tier", "", "check only the fs tier of this name")
	fl.BoolVar(&repair, "repair", false, "remove corrupt and stray files")
	fl.BoolVar(&progress, "progress", false, "print progress on stderr even when it is not a terminal")
	return cmd
}

// fsckTier checks one tier and prints its report; it returns false when
// problems remain.
func fsckTier(ctx context.Context, w, errw io.Writer, tc fs.Config, repair, force bool) bool {
	line := newProgressLine(errw, force)
	opts := fs.CheckOptions{Repair: repair}
	if line.on {
		opts.Progress = func(done, total int) {
			if done%64 == 0 || done == total {
				line.show(fmt.Sprintf("fsck %s: %d/%d files (%.0f%%)", tc.Name, done, total, 100*float64(done)/float64(max(total, 1))))
			}
		}
	}
	rep, err := fs.Check(ctx, tc, opts)
	line.done()
	if errors.Is(err, dirlock.ErrLocked) {
		fmt.Fprintf(w, "%s: skipped: %v (stop the daemon first)\n", tc.Name, err)
		return false
	}
	if err != nil {
		fmt.Fprintf(w, "%s: %v\n", tc.Name, err)
		return false
	}
	for _, f := range rep.Findings {
		done := ""
		if f.Removed {
			done = " (removed)"
		}
		fmt.Fprintf(w, "%s\t%s\t%s%s\n", f.Kind, f.Path, f.Reason, done)
	}
	corrupt, stray, foreign := rep.Count(fs.Corrupt), rep.Count(fs.Stray), rep.Count(fs.Foreign)
	fmt.Fprintf(w, "%s: %s: %d files, %d good blocks (%s), %d corrupt, %d stray, %d foreign\n",
		tc.Name, rep.Dir, rep.Files, rep.Blocks, confvalue.ByteSize(rep.Bytes).Approx(), corrupt, stray, foreign)
	if corrupt+stray == 0 {
		return true
	}
	if !repair {
		fmt.Fprintf(w, "%s: run with --repair to remove the %d corrupt and stray files\n", tc.Name, corrupt+stray)
		return false
	}
	for _, f := range rep.Findings {
		if f.Kind != fs.Foreign && !f.Removed {
			return false
		}
	}
	return true
}
