package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	kvtierv1 "github.com/kvtier/kvtier/api/kvtier/v1"
	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/offload"
)

// KEY, in every command, is what the daemon's logs print: the hex of the
// full offload key (engine hash bytes, then the 4-byte big-endian group),
// or HASHHEX/gN.
const keyHelp = `A KEY is the hex of the full offload key bytes (the engine's block hash
bytes followed by the 4-byte big-endian KV-group index), as the daemon's
logs print it; HASHHEX/gN (hash hex, decimal group) is accepted too.`

func newPutCmd() *cobra.Command {
	var rf remoteFlags
	var params string
	cmd := &cobra.Command{
		Use:   "put [flags] KEY FILE",
		Short: "Store FILE's bytes as one block in a running daemon",
		Long: `put stores FILE's bytes (- for stdin) as the block KEY in the daemon's
primary tier; the daemon cascades it to the secondary tiers its store filter
allows (--params sets kv_store_tiers). FILE must be exactly one block: the
namespace's bytes_per_block. Exit 0 when the block is stored (or was
already there), 1 on any error.

` + keyHelp,
		Example: `  kvtier put 0123abcd00000000 block.bin
  kvtier put --params '{"kv_store_tiers":[]}' 0123abcd00000000 block.bin`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			keys, err := parseKeys(args[:1])
			if err != nil {
				return err
			}
			p, err := paramsFlag(params, cmd.InOrStdin())
			if err != nil {
				return err
			}
			var data []byte
			if args[1] == "-" {
				data, err = io.ReadAll(cmd.InOrStdin())
			} else {
				data, err = os.ReadFile(args[1])
			}
			if err != nil {
				return err
			}
			c, err := rf.dial()
			if err != nil {
				return err
			}
			defer c.Close()
			ctx, cancel := rf.context(0)
			defer cancel()
			// Stats, not GetArena: a tenant may not describe the arena.
			st, err := c.Stats(ctx)
			if err != nil {
				return rf.rpcError("put", err)
			}
			if size := st.GetPrimary().GetSlotSize(); int64(len(data)) != size {
				return fmt.Errorf("put: %s is %d bytes; the daemon's blocks are %d bytes (namespace.bytes_per_block): a block is stored whole", args[1], len(data), size)
			}
			stored, err := c.PutBlocks(ctx, []client.Block{{Key: keys[0], Data: data}}, client.CallOptions{Params: p})
			if err != nil {
				return rf.rpcError("put", err)
			}
			what := "stored"
			if len(stored) == 1 && !stored[0] {
				what = "already present"
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s %s\n", args[0], what)
			return nil
		},
	}
	rf.register(cmd)
	cmd.Flags().StringVar(&params, "params", "", "kv_transfer_params: a JSON object, @FILE or - (stdin)")
	return cmd
}

func newGetCmd() *cobra.Command {
	var rf remoteFlags
	var params, out string
	var wait time.Duration
	cmd := &cobra.Command{
		Use:   "get [flags] [--wait DURATION] [-o FILE] KEY",
		Short: "Load one block from a running daemon",
		Long: `get loads the block KEY: from the primary tier, or promoted from a
secondary tier the request's load filter allows (--params sets
kv_load_tiers) within --wait. The block's bytes go to FILE (-o) or stdout.
Exit 0 on a hit; exit 3, with "miss" on stderr, when the block is not there
(or not promoted within --wait); exit 1 on any other failure.

` + keyHelp,
		Example: `  kvtier get -o block.bin 0123abcd00000000
  kvtier get --wait 5s --params '{"kv_load_tiers":[{"medium":"storage"}]}' 0123abcd00000000 > block.bin`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			keys, err := parseKeys(args)
			if err != nil {
				return err
			}
			p, err := paramsFlag(params, cmd.InOrStdin())
			if err != nil {
				return err
			}
			if wait < 0 {
				return fmt.Errorf("--wait %v is negative", wait)
			}
			c, err := rf.dial()
			if err != nil {
				return err
			}
			defer c.Close()
			ctx, cancel := rf.context(wait)
			defer cancel()
			got, err := c.GetBlocks(ctx, keys, client.GetOptions{CallOptions: client.CallOptions{Params: p}, Wait: wait})
			if err != nil {
				return rf.rpcError("get", err)
			}
			if len(got.Results) != 1 || len(got.Data) != 1 {
				return fmt.Errorf("get: the daemon answered %d results for 1 key", len(got.Results))
			}
			if got.Results[0] != kvtierv1.LookupResult_LOOKUP_RESULT_HIT {
				msg := "miss"
				switch got.Results[0] {
				case kvtierv1.LookupResult_LOOKUP_RESULT_HIT_PENDING:
					msg = fmt.Sprintf("miss (still being promoted after --wait %v)", wait)
				case kvtierv1.LookupResult_LOOKUP_RESULT_RETRY:
					msg = fmt.Sprintf("miss (a tier had not answered within --wait %v)", wait)
				}
				return &exitError{code: exitMiss, msg: msg}
			}
			if out == "" || out == "-" {
				_, err = cmd.OutOrStdout().Write(got.Data[0])
				return err
			}
			return os.WriteFile(out, got.Data[0], 0o600)
		},
	}
	rf.register(cmd)
	fl := cmd.Flags()
	fl.StringVar(&params, "params", "", "kv_transfer_params: a JSON object, @FILE or - (stdin)")
	fl.StringVarP(&out, "output", "o", "", "write the block to FILE (default stdout)")
	fl.DurationVar(&wait, "wait", 2*time.Second, "how long to wait for a promotion from a secondary tier")
	return cmd
}

// lookupLine is one key of `kvtier lookup --json`.
type lookupLine struct {
	Key    string `json:"key"`
	Result string `json:"result"`
	Tier   string `json:"tier,omitempty"`
}

func newLookupCmd() *cobra.Command {
	var rf remoteFlags
	var params string
	var asJSON bool
	var wait time.Duration
	cmd := &cobra.Command{
		Use:   "lookup [flags] KEY...",
		Short: "Say where blocks are in a running daemon",
		Long: `lookup prints one line per key: KEY hit|miss|pending [tier]. hit means
the block is in the primary tier; pending that it is being promoted from the
named secondary tier. Looking a block up in a secondary tier starts its
promotion, as an engine's lookup does; tiers that check existence
asynchronously (fs, s3, redis) get up to --wait to answer. --params sets
kv_load_tiers (a tier the filter excludes is not asked).

` + keyHelp,
		Example: `  kvtier lookup 0123abcd00000000 0123abce00000000
  kvtier lookup --json --params '{"kv_load_tiers":[]}' 0123abcd00000000`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			keys, err := parseKeys(args)
			if err != nil {
				return err
			}
			p, err := paramsFlag(params, cmd.InOrStdin())
			if err != nil {
				return err
			}
			c, err := rf.dial()
			if err != nil {
				return err
			}
			defer c.Close()
			ctx, cancel := rf.context(wait)
			defer cancel()
			id := cliRequestID("lookup")
			if _, err := c.NewRequest(ctx, id, p); err != nil {
				return rf.rpcError("lookup", err)
			}
			defer c.FinishRequest(ctx, id)
			res, src, err := lookupSettled(ctx, c, id, keys, wait)
			if err != nil {
				return rf.rpcError("lookup", err)
			}
			lines := make([]lookupLine, len(keys))
			for i := range keys {
				lines[i] = lookupLine{Key: args[i], Result: resultWord(res[i]), Tier: src[i]}
			}
			w := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(w)
				enc.SetIndent("", "  ")
				return enc.Encode(lines)
			}
			for _, l := range lines {
				fmt.Fprintln(w, strings.TrimSpace(l.Key+" "+l.Result+" "+l.Tier))
			}
			return nil
		},
	}
	rf.register(cmd)
	fl := cmd.Flags()
	fl.StringVar(&params, "params", "", "kv_transfer_params: a JSON object, @FILE or - (stdin)")
	fl.BoolVar(&asJSON, "json", false, "print a JSON array of {key, result, tier}")
	fl.DurationVar(&wait, "wait", 2*time.Second, "how long asynchronous tiers get to answer")
	return cmd
}

// lookupSettled looks keys up until no key waits for an existence check
// (RETRY without a source), ending steps so that the asynchronous tiers
// flush their checks, or until wait has passed.
func lookupSettled(ctx context.Context, c *client.Client, id string, keys []offload.Key, wait time.Duration) ([]kvtierv1.LookupResult, []string, error) {
	deadline := time.Now().Add(wait)
	for {
		res, src, err := c.LookupSources(ctx, id, keys)
		if err != nil {
			return nil, nil, err
		}
		unsettled := false
		for i, r := range res {
			if r == kvtierv1.LookupResult_LOOKUP_RESULT_RETRY && src[i] == "" {
				unsettled = true
			}
		}
		if !unsettled || time.Now().After(deadline) {
			return res, src, nil
		}
		if _, err := c.ScheduleEnd(ctx, nil, nil); err != nil {
			return nil, nil, err
		}
		time.Sleep(5 * time.Millisecond) // the tiers' checks run on their own workers
	}
}

func resultWord(r kvtierv1.LookupResult) string {
	switch r {
	case kvtierv1.LookupResult_LOOKUP_RESULT_HIT:
		return "hit"
	case kvtierv1.LookupResult_LOOKUP_RESULT_HIT_PENDING, kvtierv1.LookupResult_LOOKUP_RESULT_RETRY:
		return "pending"
	}
	return "miss"
}
