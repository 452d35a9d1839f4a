// Command kvtier is kvtier's command-line tool.
//
//	kvtier serve [--config FILE]
//	kvtier explain --config FILE --params JSON [--json]
//	kvtier bench --trace FILE [--config FILE] [--json]
//	kvtier put|get|lookup|stats [--target ADDR] ...
//	kvtier fsck --config FILE [--tier NAME] [--repair]
//	kvtier version
//
// serve runs the daemon (the embedded default configuration needs nothing
// outside the process). explain prints, for a config file and a request's
// kv_transfer_params, which secondary tiers the request would load from
// and store to, and why. bench replays a request trace through the tiers
// of a config and reports hit rates. put, get, lookup and stats talk to a
// running daemon; fsck checks an fs tier's files offline.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
)

// version is set at build time:
//
//	go build -ldflags "-X main.version=v0.1.0" ./cmd/kvtier
var version = "dev"

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// run executes the command line args and returns the exit code. Tests
// call it in-process.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	root := newRootCmd(stdin, stdout, stderr)
	root.SetArgs(args)
	if err := root.Execute(); err != nil {
		var ee *exitError
		switch {
		case errors.As(err, &ee):
			if ee.msg != "" {
				fmt.Fprintln(stderr, ee.msg)
			}
			return ee.code
		case !errors.Is(err, errReported):
			fmt.Fprintf(stderr, "kvtier: %v\n", err)
		}
		return 1
	}
	return 0
}

// errReported marks an error the command already printed in its own
// format (the JSON error object of explain --json).
var errReported = errors.New("error already reported")

func newRootCmd(stdin io.Reader, stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "kvtier",
		Short: "Multi-tier KV-cache offloading for LLM serving",
		Long: `kvtier keeps KV-cache blocks offloaded by an inference engine in a CPU
primary tier, cascades them to secondary tiers (local disk, S3-compatible
object storage, Redis) and promotes them back — or reads them from other
kvtier daemons — honouring per-request tier filters.`,
		SilenceErrors: true,
		SilenceUsage:  true,
	}
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.AddCommand(newVersionCmd(), newExplainCmd(), newServeCmd(), newBenchCmd(),
		newPutCmd(), newGetCmd(), newLookupCmd(), newStatsCmd(), newFsckCmd(), newFSLayoutCmd(), newKeysCmd(), newResidencyCmd(), newPrefetchCmd(), newPinCmd(), newUnpinCmd(), newDeleteCmd())
	return root
}
