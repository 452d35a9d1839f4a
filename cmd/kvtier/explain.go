package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/kvtier/kvtier/config"
	"github.com/kvtier/kvtier/explain"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/tierset"
)

type explainFlags struct {
	config string
	params string
	json   bool
}

func newExplainCmd() *cobra.Command {
	var f explainFlags
	cmd := &cobra.Command{
		Use:   "explain --config FILE --params JSON [--json]",
		Short: "Show which secondary tiers a request would load from and store to, and why",
		Long: `explain reads a config file and one request's kv_transfer_params and prints,
for each configured secondary tier in config order, whether the request would
load from it and store to it, and why: which matcher matched, that the tier is
dynamic on an axis, that the filter is [] or ALL, that no matcher matched, and
whether the filter came from the request or from the server default. Problems
found in the request's filters are listed as warnings. The CPU primary tier
always takes part and is not listed.

--params takes the JSON itself, @FILE to read it from a file, or - for stdin.
With --json the output is one object {"load": [...], "store": [...],
"warnings": [...]}, or {"error": "..."} with a non-zero exit status when the
request is rejected (strict validation, params that are not a JSON object) or
the config is invalid.`,
		Example: `  kvtier explain --config examples/explain.yaml --params '{"kv_load_tiers":[{"medium":"storage"}]}'
  echo '{"kv_store_tiers":[]}' | kvtier explain --config examples/explain.yaml --params - --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			e, cfg, err := explainRequest(f, cmd.InOrStdin())
			if f.json {
				return writeExplainJSON(cmd.OutOrStdout(), e, err)
			}
			if err != nil {
				return err
			}
			return writeExplainText(cmd.OutOrStdout(), cfg, e)
		},
	}
	cmd.Flags().StringVar(&f.config, "config", "", "config file (YAML)")
	cmd.Flags().StringVar(&f.params, "params", "", "kv_transfer_params as JSON, @FILE, or - for stdin (default: none)")
	cmd.Flags().BoolVar(&f.json, "json", false, "print one JSON object")
	_ = cmd.MarkFlagRequired("config") // only fails for an unknown flag name
	return cmd
}

// explainRequest loads the config, parses the params as the server would and
// explains the request.
func explainRequest(f explainFlags, stdin io.Reader) (explain.Explanation, *config.Config, error) {
	params, err := readParams(f.params, stdin)
	if err != nil {
		return explain.Explanation{}, nil, err
	}
	cfg, err := config.Load(f.config)
	if err != nil {
		return explain.Explanation{}, nil, err
	}
	decls, err := tierset.Declare(cfg)
	if err != nil {
		return explain.Explanation{}, nil, err
	}
	p := cfg.Parser()
	rc, err := p.NewReqContext("explain", params)
	if err != nil {
		if errors.Is(err, offload.ErrInvalidFilter) {
			return explain.Explanation{}, nil, fmt.Errorf("request rejected (strict validation): %w", err)
		}
		return explain.Explanation{}, nil, fmt.Errorf("--params: %w", err)
	}
	e := explain.Explain(decls, p, rc)
	details, err := tierset.DeclareDetails(cfg)
	if err != nil {
		return explain.Explanation{}, nil, err
	}
	e.AddDetails(details)
	return e, cfg, nil
}

// readParams resolves the --params value: literal JSON, @FILE or - (stdin).
// Empty means the request sends no kv_transfer_params.
func readParams(v string, stdin io.Reader) ([]byte, error) {
	switch {
	case v == "-":
		b, err := io.ReadAll(stdin)
		if err != nil {
			return nil, fmt.Errorf("--params -: read stdin: %w", err)
		}
		return b, nil
	case strings.HasPrefix(v, "@"):
		b, err := os.ReadFile(v[1:])
		if err != nil {
			return nil, fmt.Errorf("--params: %w", err)
		}
		return b, nil
	}
	return []byte(v), nil
}

// explainJSON is the --json output; the slices are never nil so that they
// encode as [] rather than null.
type explainJSON struct {
	Load     []string `json:"load"`
	Store    []string `json:"store"`
	Warnings []string `json:"warnings"`
}

func writeExplainJSON(w io.Writer, e explain.Explanation, err error) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	if err != nil {
		if werr := enc.Encode(map[string]string{"error": err.Error()}); werr != nil {
			return werr
		}
		return errReported
	}
	out := explainJSON{Load: e.LoadTiers(), Store: e.StoreTiers(), Warnings: []string{}}
	for _, warn := range e.Warnings {
		out.Warnings = append(out.Warnings, warn.Message)
	}
	return enc.Encode(out)
}

func writeExplainText(w io.Writer, cfg *config.Config, e explain.Explanation) error {
	var b strings.Builder
	fmt.Fprintf(&b, "config %s: %d secondary tiers, validation %s\n", cfg.File, len(e.Tiers), cfg.Validation)
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "load filter:\t%s\t%s\n", e.Load.Filter, e.Load.Source())
	fmt.Fprintf(tw, "store filter:\t%s\t%s\n", e.Store.Filter, e.Store.Source())
	tw.Flush()
	b.WriteString("\n")

	if len(e.Tiers) == 0 {
		b.WriteString("No secondary tiers are configured: only the CPU primary tier serves requests.\n")
	}
	for _, v := range e.Tiers {
		fmt.Fprintf(&b, "%s\n", v.Declaration)
		tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
		fmt.Fprintf(tw, "  load\t%s\t%s\n", yesNo(v.Load.Allowed), v.Load.Reason)
		fmt.Fprintf(tw, "  store\t%s\t%s\n", yesNo(v.Store.Allowed), v.Store.Reason)
		for _, part := range v.Parts {
			// The tier decides per part itself, with the same filter; a
			// peer tier never stores.
			fmt.Fprintf(tw, "  load from %s\t%s\t%s\n", part.Declaration, yesNo(v.Load.Allowed && part.Load.Allowed), part.Load.Reason)
		}
		tw.Flush()
	}
	if len(e.Tiers) > 0 {
		b.WriteString("\n")
		tw = tabwriter.NewWriter(&b, 0, 0, 1, ' ', 0)
		fmt.Fprintf(tw, "loads from:\t%s\n", list(e.LoadTiers()))
		fmt.Fprintf(tw, "stores to:\t%s\n", list(e.StoreTiers()))
		tw.Flush()
	}
	b.WriteString("(the CPU primary tier always takes part and is not listed)\n")

	if len(e.Warnings) == 0 {
		b.WriteString("\nwarnings: none\n")
	} else {
		fmt.Fprintf(&b, "\nwarnings (%d):\n", len(e.Warnings))
		for _, warn := range e.Warnings {
			fmt.Fprintf(&b, "  %s\n", warn.Message)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func yesNo(ok bool) string {
	if ok {
		return "yes"
	}
	return "no"
}

func list(names []string) string {
	if len(names) == 0 {
		return "no secondary tier"
	}
	return strings.Join(names, ", ")
}
