package main

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version, the Go version and the build's module information",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprint(cmd.OutOrStdout(), versionText())
			return err
		},
	}
}

// versionText renders the version set by -ldflags (falling back to the
// module version of a `go install ...@vX` build) and the build info.
func versionText() string {
	v := version
	bi, ok := debug.ReadBuildInfo()
	if v == "dev" && ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		v = bi.Main.Version
	}
	s := fmt.Sprintf("kvtier %s\n%s %s/%s\n", v, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	if !ok {
		return s
	}
	s += fmt.Sprintf("module %s %s\n", bi.Main.Path, bi.Main.Version)
	for _, kv := range bi.Settings {
		switch kv.Key {
		case "vcs.revision", "vcs.time", "vcs.modified", "CGO_ENABLED", "-race":
			s += fmt.Sprintf("%s %s\n", kv.Key, kv.Value)
		}
	}
	return s
}
