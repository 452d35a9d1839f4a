package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	kvtierv1 "github.com/kvtier/kvtier/api/kvtier/v1"
	"github.com/kvtier/kvtier/blockhash"
	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/offload"
)

// The commands for routers and agents (residency, prefetch, pin, unpin,
// delete):
// they name prefixes by keys or by token ids.

// prefixFlags say where a command's prefixes come from: keys as
// arguments (one prefix), --keys (a prefix per line) or --tokens (a
// prompt per line, hashed as `kvtier keys` does).
type prefixFlags struct {
	keys   string
	tokens string
	kf     keysFlags
}

func (f *prefixFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.keys, "keys", "", "FILE (- for stdin) of prefixes, one per line: hex keys separated by spaces, or a JSON line of `kvtier keys`")
	fl.StringVar(&f.tokens, "tokens", "", "FILE (- for stdin) of prompts as `kvtier keys` reads them; needs --block-size")
	fl.IntVar(&f.kf.blockSize, "block-size", 0, "with --tokens: the engine's hash block size (see kvtier keys)")
	fl.IntVar(&f.kf.tokensPerKey, "tokens-per-key", 0, "with --tokens: the offloading connector's block size")
	fl.StringVar(&f.kf.algo, "hash-algo", blockhash.SHA256, "with --tokens: sha256 | sha256_cbor")
	fl.StringVar(&f.kf.seed, "seed", "", "with --tokens: the engine's PYTHONHASHSEED")
	fl.StringVar(&f.kf.cacheSalt, "cache-salt", "", "with --tokens: the requests' cache_salt")
	fl.StringVar(&f.kf.loraName, "lora-name", "", "with --tokens: the requests' LoRA adapter name")
	fl.StringVar(&f.kf.loraPath, "lora-path", "", "with --tokens: the requests' LoRA adapter path")
	fl.Uint32Var(&f.kf.group, "group", 0, "with --tokens: the KV-cache group index")
}

// prefixes returns the prefixes the flags and args name, in order.
func (f *prefixFlags) prefixes(cmd *cobra.Command, args []string) ([][]offload.Key, error) {
	given := 0
	for _, set := range []bool{len(args) > 0, f.keys != "", f.tokens != ""} {
		if set {
			given++
		}
	}
	if given != 1 {
		return nil, fmt.Errorf("name the prefix one way: KEY arguments, --keys FILE or --tokens FILE")
	}
	if len(args) > 0 {
		keys, err := parseKeys(args)
		return [][]offload.Key{keys}, err
	}
	open := func(name string) (io.ReadCloser, error) {
		if name == "-" {
			return io.NopCloser(cmd.InOrStdin()), nil
		}
		return os.Open(name)
	}
	if f.tokens != "" {
		f.kf.lora = cmd.Flags().Changed("lora-name")
		in, err := open(f.tokens)
		if err != nil {
			return nil, err
		}
		defer in.Close()
		var out bytes.Buffer
		if err := computeKeys(f.kf, in, &out); err != nil {
			return nil, fmt.Errorf("--tokens: %w", err)
		}
		return readPrefixes(&out, "--tokens")
	}
	in, err := open(f.keys)
	if err != nil {
		return nil, err
	}
	defer in.Close()
	return readPrefixes(in, "--keys")
}

// prefixCmd is what every router command has: the connection flags and
// where its prefixes come from.
type prefixCmd struct {
	rf remoteFlags
	pf prefixFlags
}

func (p *prefixCmd) register(cmd *cobra.Command) {
	p.rf.register(cmd)
	p.pf.register(cmd)
}

// each dials the daemon and calls fn for every prefix the flags and args
// name, in order; a failed call ends the command with the operator's
// message for it.
func (p *prefixCmd) each(cmd *cobra.Command, args []string, what string, fn func(ctx context.Context, c *client.Client, keys []offload.Key) error) error {
	prefixes, err := p.pf.prefixes(cmd, args)
	if err != nil {
		return err
	}
	c, err := p.rf.dial()
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cancel := p.rf.context(0)
	defer cancel()
	for _, keys := range prefixes {
		if err := fn(ctx, c, keys); err != nil {
			return p.rf.rpcError(what, err)
		}
	}
	return nil
}

// readPrefixes reads one prefix per non-blank line: hex keys separated by
// white space, or a JSON object with "keys" (`kvtier keys`).
func readPrefixes(r io.Reader, what string) ([][]offload.Key, error) {
	var out [][]offload.Key
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		fields := strings.Fields(line)
		if strings.HasPrefix(line, "{") {
			var kl keysLine
			if err := json.Unmarshal([]byte(line), &kl); err != nil {
				return nil, fmt.Errorf("%s line %d: %w", what, n, err)
			}
			if kl.Error != "" {
				return nil, fmt.Errorf("%s line %d: %s", what, n, kl.Error)
			}
			fields = kl.Keys
		}
		keys, err := parseKeys(fields)
		if err != nil {
			return nil, fmt.Errorf("%s line %d: %w", what, n, err)
		}
		out = append(out, keys)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no prefix", what)
	}
	return out, nil
}

// residencyLine is one prefix's answer of `kvtier residency --json`.
type residencyLine struct {
	Keys     int             `json:"keys"`
	Primary  uint32          `json:"primary"`
	Loadable uint32          `json:"loadable"`
	Tiers    []residencyTier `json:"tiers"`
	Warnings []string        `json:"warnings,omitempty"`
}

type residencyTier struct {
	Name     string `json:"name"`
	Medium   string `json:"medium"`
	Locality string `json:"locality"`
	Allowed  bool   `json:"allowed"`
	Known    bool   `json:"known"`
	Run      uint32 `json:"run"`
}

func newResidencyCmd() *cobra.Command {
	var pc prefixCmd
	var params string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "residency [flags] KEY... | --keys FILE | --tokens FILE",
		Short: "Say how much of a prefix each tier of a running daemon holds, changing nothing",
		Long: `residency prints, for each prefix, how many of its leading keys are ready in
the primary, how many each secondary tier holds, and how many a request with
--params' kv_load_tiers would find (loadable). Nothing is promoted, pinned,
touched or counted: a router can ask as often as it routes. A tier the
filter excludes is not asked ("not allowed"), nor is a tier that could only
tell by I/O (s3, redis, peer: "unknown").

` + keyHelp,
		Example: `  kvtier residency 0123abcd00000000 0123abce00000000
  kvtier keys --block-size 16 prompts.jsonl | kvtier residency --keys - --json
  kvtier residency --tokens prompt.json --block-size 16 --params '{"kv_load_tiers":[{"medium":"cpu"}]}'`,
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := paramsFlag(params, cmd.InOrStdin())
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			enc := json.NewEncoder(w)
			return pc.each(cmd, args, "residency", func(ctx context.Context, c *client.Client, keys []offload.Key) error {
				r, err := c.Residency(ctx, keys, p)
				if err != nil {
					return err
				}
				l := residencyOf(len(keys), r)
				if asJSON {
					return enc.Encode(l)
				}
				writeResidency(w, l)
				return nil
			})
		},
	}
	pc.register(cmd)
	fl := cmd.Flags()
	fl.StringVar(&params, "params", "", "kv_transfer_params: a JSON object, @FILE or - (stdin)")
	fl.BoolVar(&asJSON, "json", false, "print one JSON object per prefix")
	return cmd
}

func newPrefetchCmd() *cobra.Command {
	var pc prefixCmd
	var params string
	var deadline time.Duration
	cmd := &cobra.Command{
		Use:   "prefetch [flags] KEY... | --keys FILE | --tokens FILE",
		Short: "Promote prefixes toward the primary of a running daemon before their requests come",
		Long: `prefetch asks the daemon to promote each prefix's leading run that --params'
kv_load_tiers allows into its primary, as an engine's lookups would, so that
the engine's lookup answers HIT in the step that asks. The daemon keeps
trying tiers that are not sure yet (fs, s3, redis check existence
asynchronously) until --deadline; a miss ends the run. Promotions in flight
are bounded by the daemon's prefetch.share; asking again is harmless. One
line per prefix: how many keys were present, how many promotions started,
and whether the daemon still works on it.

` + keyHelp,
		Example: `  kvtier prefetch 0123abcd00000000 0123abce00000000
  kvtier prefetch --tokens prompt.json --block-size 16 --deadline 2s`,
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := paramsFlag(params, cmd.InOrStdin())
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			return pc.each(cmd, args, "prefetch", func(ctx context.Context, c *client.Client, keys []offload.Key) error {
				a, err := c.Prefetch(ctx, keys, p, deadline)
				if err != nil {
					return err
				}
				state := "done"
				if a.GetQueued() {
					state = "waiting"
				}
				fmt.Fprintf(w, "%d keys: %d present, %d promotions started, %s\n", len(keys), a.GetPresent(), a.GetStarted(), state)
				for _, m := range a.GetWarnings() {
					fmt.Fprintln(w, "  warning:", m.GetMessage())
				}
				return nil
			})
		},
	}
	pc.register(cmd)
	fl := cmd.Flags()
	fl.StringVar(&params, "params", "", "kv_transfer_params: a JSON object, @FILE or - (stdin)")
	fl.DurationVar(&deadline, "deadline", 0, "how long the daemon keeps trying tiers that are not sure yet (default 10s)")
	return cmd
}

func newPinCmd() *cobra.Command {
	var pc prefixCmd
	var ttl time.Duration
	cmd := &cobra.Command{
		Use:   "pin --ttl D [flags] KEY... | --keys FILE | --tokens FILE",
		Short: "Keep prefixes in the primary of a running daemon until a TTL passes",
		Long: `pin keeps each prefix's blocks that are ready in the daemon's primary there
for --ttl (at most 24h); pinning again extends the TTL. Keys not in the
primary are "missing" (prefetch them first); keys over the owner's
pins.share are "refused". Pins live in the daemon: an engine's restart keeps
them, the daemon's drops them. kvtier unpin releases them early.

` + keyHelp,
		Example: `  kvtier pin --ttl 10m --tokens system-prompt.json --block-size 16`,
		RunE: func(cmd *cobra.Command, args []string) error {
			return pc.each(cmd, args, "pin", func(ctx context.Context, c *client.Client, keys []offload.Key) error {
				a, err := c.Pin(ctx, keys, ttl)
				if err == nil {
					fmt.Fprintf(cmd.OutOrStdout(), "%d keys: %d pinned, %d missing, %d refused\n", len(keys), a.GetPinned(), a.GetMissing(), a.GetRefused())
				}
				return err
			})
		},
	}
	pc.register(cmd)
	cmd.Flags().DurationVar(&ttl, "ttl", 0, "how long the pins last (required, at most 24h)")
	_ = cmd.MarkFlagRequired("ttl")
	return cmd
}

func newUnpinCmd() *cobra.Command {
	var pc prefixCmd
	cmd := &cobra.Command{
		Use:   "unpin [flags] KEY... | --keys FILE | --tokens FILE",
		Short: "Release pins before their TTL",
		Long:  "unpin releases the pins kvtier pin took on each prefix's keys (keys not\npinned are skipped) and prints how many it released.\n\n" + keyHelp,
		RunE: func(cmd *cobra.Command, args []string) error {
			return pc.each(cmd, args, "unpin", func(ctx context.Context, c *client.Client, keys []offload.Key) error {
				n, err := c.Unpin(ctx, keys)
				if err == nil {
					fmt.Fprintf(cmd.OutOrStdout(), "%d keys: %d unpinned\n", len(keys), n)
				}
				return err
			})
		},
	}
	pc.register(cmd)
	return cmd
}

func newDeleteCmd() *cobra.Command {
	var pc prefixCmd
	var all bool
	var tenant string
	cmd := &cobra.Command{
		Use:   "delete [flags] KEY... | --keys FILE | --tokens FILE | --all [--tenant NAME]",
		Short: "Remove blocks from every tier of a running daemon",
		Long: `delete removes each prefix's blocks from the daemon's primary and from every
secondary tier that removes blocks on request (fs, memory, redis, s3), publishing their
removal per medium for routers' indexes, and releases pins on them. The
daemon first waits for the transfers in flight. A block an engine is
reading stays in the primary ("held"); tiers that do not delete on request
(s3, redis, peer) keep theirs until their own eviction ("not supported").

--all removes every block of a key space instead, from the primary and from
every tier that can list what it holds (fs, memory): with a tenant's token
the tenant's own; with the admin's, the tenant --tenant names (offboarding).

` + keyHelp,
		Example: `  kvtier delete --tokens prompt.json --block-size 16
  kvtier delete --all --tenant acme --token-file /etc/kvtier/admin.token`,
		RunE: func(cmd *cobra.Command, args []string) error {
			w := cmd.OutOrStdout()
			report := func(what string, a *kvtierv1.DeleteResponse) {
				fmt.Fprintf(w, "%s: primary %d removed, %d held", what, a.GetPrimary(), a.GetHeld())
				for _, t := range a.GetTiers() {
					switch {
					case !t.GetSupported():
						fmt.Fprintf(w, ", %s not supported", t.GetName())
					case t.GetError() != "":
						fmt.Fprintf(w, ", %s failed: %s", t.GetName(), t.GetError())
					default:
						fmt.Fprintf(w, ", %s %d removed", t.GetName(), t.GetRemoved())
					}
				}
				fmt.Fprintln(w)
			}
			if all {
				if len(args) > 0 || pc.pf.keys != "" || pc.pf.tokens != "" {
					return errors.New("delete --all removes a whole key space: name no keys")
				}
				c, err := pc.rf.dial()
				if err != nil {
					return err
				}
				defer c.Close()
				ctx, cancel := pc.rf.context(0)
				defer cancel()
				a, err := c.DeleteAll(ctx, tenant)
				if err != nil {
					return pc.rf.rpcError("delete", err)
				}
				report("all blocks", a)
				return nil
			}
			if tenant != "" {
				return errors.New("--tenant goes with --all")
			}
			return pc.each(cmd, args, "delete", func(ctx context.Context, c *client.Client, keys []offload.Key) error {
				a, err := c.Delete(ctx, keys)
				if err != nil {
					return err
				}
				report(fmt.Sprintf("%d keys", len(keys)), a)
				return nil
			})
		},
	}
	pc.register(cmd)
	cmd.Flags().BoolVar(&all, "all", false, "remove every block of a key space (a tenant's own; the admin names --tenant)")
	cmd.Flags().StringVar(&tenant, "tenant", "", "with --all and the admin's token: the tenant whose blocks go")
	return cmd
}

func residencyOf(n int, r *kvtierv1.ResidencyResponse) residencyLine {
	l := residencyLine{Keys: n, Primary: r.GetPrimary(), Loadable: r.GetLoadable(), Tiers: []residencyTier{}}
	for _, t := range r.GetTiers() {
		l.Tiers = append(l.Tiers, residencyTier{
			Name: t.GetName(), Medium: offload.Medium(t.GetMedium()).String(), Locality: offload.Locality(t.GetLocality()).String(),
			Allowed: t.GetAllowed(), Known: t.GetKnown(), Run: t.GetRun(),
		})
	}
	for _, w := range r.GetWarnings() {
		l.Warnings = append(l.Warnings, w.GetMessage())
	}
	return l
}

func writeResidency(w io.Writer, l residencyLine) {
	fmt.Fprintf(w, "%d keys: loadable %d, primary %d", l.Keys, l.Loadable, l.Primary)
	for _, t := range l.Tiers {
		state := fmt.Sprint(t.Run)
		switch {
		case !t.Allowed:
			state = "not allowed"
		case !t.Known:
			state = "unknown"
		}
		fmt.Fprintf(w, ", %s %s", t.Name, state)
	}
	fmt.Fprintln(w)
	for _, m := range l.Warnings {
		fmt.Fprintln(w, "  warning:", m)
	}
}
