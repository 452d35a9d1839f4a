package main

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvtier/kvtier/config"
	"github.com/kvtier/kvtier/confvalue"
	"github.com/kvtier/kvtier/tiering"
	"github.com/kvtier/kvtier/workload"
)

type benchFlags struct {
	trace         string
	config        string
	primaryBlocks int
	blockBytes    string
	policy        string
	params        string
	limit         int
	json          bool
	timed         bool
	speedup       float64
	step          time.Duration
	budget        string
	plot          string
	plotSizes     string
	progress      bool
	warm          bool
	// noisy neighbour
	noiseBlocks int
	traceQuota  int
	// fleet replay
	nodes        int
	routing      string
	seed         uint64
	peers        bool
	sharedBlocks int
}

func newBenchCmd() *cobra.Command {
	var f benchFlags
	cmd := &cobra.Command{
		Use:   "bench --trace FILE [--config FILE] [--primary-blocks N] [--block-bytes N] [--policy lru|arc] [--params JSON] [--limit N] [--json]",
		Short: "Replay a request trace through the tiers and report prefix hit rates",
		Long: `bench replays a request trace (Mooncake format: one JSON object per line with
timestamp, input_length, output_length and hash_ids, one id per 512-token
block) through a real CPU primary tier, the secondary tiers of --config and
the tiering manager, one request after another, as an inference engine's
connector would: look the request's blocks up as a prefix, step until
promotions from secondary tiers settle, load the hit prefix, store the
missing blocks. It reports the prefix hit rate (matched leading blocks over
all blocks), which tier served the hits, evictions, cascades and throughput,
next to a plain-LRU reference computed from the trace alone.

The primary comes from the flags (--primary-blocks of --block-bytes each,
--policy); the config supplies the secondary tiers, the default filters and
the validation mode, and its primary section is not used. Blocks carry no
data worth the bytes, so keep --block-bytes small: an unbounded memory tier
holds every distinct block of the trace.

--params is the kv_transfer_params every request sends: the JSON itself,
@FILE, or - for stdin. Compare e.g. '{"kv_load_tiers":[]}' with the default.
--trace - reads the trace from stdin; gzip-compressed traces are detected.
By default timestamps are not honoured and requests do not overlap: the
figures describe cache behaviour and manager cost, not latency under load.

--timed replays the trace at its recorded arrival times divided by --speedup,
with an engine that steps every --step: requests overlap, a request waits
while its promotions run, stores complete one step after they are prepared,
so slow tiers compete with wall-clock time as they do in production (the
replay then takes the trace's span divided by --speedup). The per-tier table
shows cascades dropped by reason (pressure, budget, tier_budget, queue_full,
tier_down, cancelled); --budget sets the share of the primary that cascades in
flight may pin (default 0.25, "off" for none).

--plot FILE.png draws the hit rate split by source and, replaying once per
size of --plot-sizes, hit rate against primary size next to plain LRU (charts
need a kvtier built with -tags charts: go run -tags charts ./cmd/kvtier bench
...; the daemon binary links no plotting library). A progress line is shown
on a terminal (--progress forces it).

--nodes N replays the trace over a fleet of N simulated nodes, each with its
own primary of --primary-blocks and its own tiers of --config (fs tiers in
scratch directories of their own), routing each request by --routing:
round-robin, random (drawn from --seed) or prefix-aware (to the node whose
primary holds the longest leading run of the request's blocks, from the
nodes' KV events; ties to the least-loaded node); a comma-separated list
compares policies. --peers gives every node a peer tier over the other
nodes' primaries (read-only, remote), --shared-blocks N one remote store of
N blocks shared by all nodes (a model of a fleet's Redis Cluster). It
reports the fleet's hit rate split by source (own DRAM, own disk, own other
tiers, peer, shared); --plot draws it. The same flags and seed give the same
figures.`,
		Example: `  kvtier bench --trace mooncake_conversation_trace.jsonl --primary-blocks 1000
  kvtier bench --trace trace.jsonl --config tiers.yaml --timed --speedup 60 --plot hits.png
  kvtier bench --trace trace.jsonl --config tiers.yaml --params '{"kv_load_tiers":[]}'
  kvtier bench --trace trace.jsonl.gz --policy arc --limit 2000 --json
  kvtier bench --trace trace.jsonl --nodes 4 --routing round-robin,prefix-aware --peers --shared-blocks 20000`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			if f.fleetMode() {
				rep, err := benchFleetCmd(ctx, f, cmd.InOrStdin(), cmd.ErrOrStderr())
				if f.json {
					return writeFleetJSON(cmd.OutOrStdout(), rep, err)
				}
				if err != nil {
					return err
				}
				return writeFleetText(cmd.OutOrStdout(), rep)
			}
			rep, err := bench(ctx, f, cmd.InOrStdin(), cmd.ErrOrStderr())
			if f.json {
				return writeBenchJSON(cmd.OutOrStdout(), rep, err)
			}
			if err != nil {
				return err
			}
			return writeBenchText(cmd.OutOrStdout(), rep)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.trace, "trace", "", "trace file (JSON lines, optionally gzip-compressed; - for stdin)")
	fl.StringVar(&f.config, "config", "", "config file (YAML) with the secondary tiers; default: none")
	fl.IntVar(&f.primaryBlocks, "primary-blocks", workload.DefaultPrimaryBlocks, "primary tier capacity in blocks")
	fl.StringVar(&f.blockBytes, "block-bytes", fmt.Sprint(workload.DefaultBlockBytes), "bytes per block, e.g. 1024 or 4KiB")
	fl.StringVar(&f.policy, "policy", "lru", "primary eviction policy: lru or arc")
	fl.StringVar(&f.params, "params", "", "kv_transfer_params of every request: JSON, @FILE, or - for stdin (default: none)")
	fl.IntVar(&f.limit, "limit", 0, "replay at most this many requests (0 = all)")
	fl.BoolVar(&f.json, "json", false, "print one JSON object")
	fl.BoolVar(&f.timed, "timed", false, "replay at the trace's arrival times (see --speedup, --step)")
	fl.Float64Var(&f.speedup, "speedup", 1, "with --timed: divide the trace's inter-arrival times by this factor")
	fl.DurationVar(&f.step, "step", workload.DefaultStep, "with --timed: the modelled engine step")
	fl.StringVar(&f.budget, "budget", "", `share of the primary cascades in flight may pin, in (0,1], or "off" (default 0.25)`)
	fl.StringVar(&f.plot, "plot", "", "write a PNG chart of the hit rates to this file")
	fl.StringVar(&f.plotSizes, "plot-sizes", "", "with --plot: comma-separated primary sizes in blocks to sweep (default: ¼, ½, 1, 2 and 4 × --primary-blocks)")
	fl.BoolVar(&f.progress, "progress", false, "print progress on stderr even when it is not a terminal")
	fl.BoolVar(&f.warm, "warm-tiers", false, "run fs tiers in their root_dir as configured, keeping what they hold (default: a scratch directory under it per replay)")
	fl.IntVar(&f.noiseBlocks, "noise-blocks", 0, "a noisy neighbour: a second tenant storing this many new, never-read blocks after every request")
	fl.IntVar(&f.traceQuota, "trace-quota", 0, "with --noise-blocks: the trace's tenant's quota of the primary in blocks, the neighbour's the rest (0: no quotas, one eviction order)")
	fl.IntVar(&f.nodes, "nodes", 1, "replay over a fleet of this many simulated nodes")
	fl.StringVar(&f.routing, "routing", workload.RouteRoundRobin, "with a fleet: round-robin, random or prefix-aware (comma-separated to compare)")
	fl.Uint64Var(&f.seed, "seed", 1, "with --routing random: the seed")
	fl.BoolVar(&f.peers, "peers", false, "with a fleet: a peer tier on every node over the other nodes' primaries")
	fl.IntVar(&f.sharedBlocks, "shared-blocks", 0, "with a fleet: one remote store of this many blocks shared by all nodes")
	_ = cmd.MarkFlagRequired("trace") // only fails for an unknown flag name
	cmd.AddCommand(newBenchPlotServingCmd())
	return cmd
}

// benchReport is what bench measured, with the inputs that explain it.
type benchReport struct {
	Trace      string
	ConfigFile string
	Params     []byte
	Opts       workload.Options
	Result     *workload.Result
	// Reference hit rates of a plain LRU over blocks at the primary's
	// capacity and unbounded, from the trace alone.
	RefLRU, RefMax float64
	// Sweep is the --plot size sweep.
	Sweep []sweepPoint
}

type sweepPoint struct {
	PrimaryBlocks int     `json:"primary_blocks"`
	HitRate       float64 `json:"hit_rate"`
	LRUHitRate    float64 `json:"lru_hit_rate"`
}

// benchInputs parses the flags every replay needs: the trace, the config,
// the params and the per-node options.
func benchInputs(f benchFlags, stdin io.Reader, stderr io.Writer) ([]workload.Request, workload.Options, error) {
	var opts workload.Options
	if f.trace == "-" && f.params == "-" {
		return nil, opts, errors.New("--trace - and --params - cannot both read stdin")
	}
	if f.primaryBlocks <= 0 {
		return nil, opts, fmt.Errorf("--primary-blocks %d: want > 0", f.primaryBlocks)
	}
	if f.limit < 0 {
		return nil, opts, fmt.Errorf("--limit %d: want >= 0", f.limit)
	}
	bb, err := confvalue.ParseByteSize(f.blockBytes)
	if err != nil {
		return nil, opts, fmt.Errorf("--block-bytes: %w", err)
	}
	blockBytes, ok := bb.Int()
	if !ok || blockBytes <= 0 {
		return nil, opts, fmt.Errorf("--block-bytes %s: want a positive size", f.blockBytes)
	}
	switch strings.ToLower(f.policy) {
	case "lru", "arc":
	default:
		return nil, opts, fmt.Errorf("--policy %q: want lru or arc", f.policy)
	}
	params, err := readParams(f.params, stdin)
	if err != nil {
		return nil, opts, err
	}
	var cfg *config.Config
	if f.config != "" {
		if cfg, err = config.Load(f.config); err != nil {
			return nil, opts, err
		}
	}
	reqs, err := readTrace(f.trace, f.limit, stdin)
	if err != nil {
		return nil, opts, err
	}
	budget, err := parseBudget(f.budget)
	if err != nil {
		return nil, opts, err
	}
	if !f.timed && (f.speedup != 1 || f.step != workload.DefaultStep) {
		return nil, opts, errors.New("--speedup and --step need --timed")
	}
	var noise *workload.Noise
	switch {
	case f.noiseBlocks < 0:
		return nil, opts, fmt.Errorf("--noise-blocks %d: want >= 0", f.noiseBlocks)
	case f.traceQuota != 0 && f.noiseBlocks == 0:
		return nil, opts, errors.New("--trace-quota needs --noise-blocks")
	case f.noiseBlocks > 0 && f.nodes > 1:
		return nil, opts, errors.New("--noise-blocks replays one node, not a fleet (--nodes)")
	case f.noiseBlocks > 0:
		noise = &workload.Noise{BlocksPerRequest: f.noiseBlocks, TraceQuota: f.traceQuota}
	}
	return reqs, workload.Options{
		Noise:         noise,
		PrimaryBlocks: f.primaryBlocks,
		BlockBytes:    blockBytes,
		Policy:        strings.ToLower(f.policy),
		Config:        cfg,
		Params:        params,
		Logger:        slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Timed:         f.timed,
		Speedup:       f.speedup,
		Step:          f.step,
		Budget:        budget,
		FreshTiers:    !f.warm,
	}, nil
}

func benchFleetCmd(ctx context.Context, f benchFlags, stdin io.Reader, stderr io.Writer) (*fleetReport, error) {
	reqs, opts, err := benchInputs(f, stdin, stderr)
	if err != nil {
		return nil, err
	}
	return benchFleet(ctx, f, reqs, opts)
}

func bench(ctx context.Context, f benchFlags, stdin io.Reader, stderr io.Writer) (*benchReport, error) {
	reqs, opts, err := benchInputs(f, stdin, stderr)
	if err != nil {
		return nil, err
	}
	sizes, err := plotSizes(f)
	if err != nil {
		return nil, err
	}
	prog := newProgressLine(stderr, f.progress)
	run := func(o workload.Options, label string) (*workload.Result, error) {
		o.Progress = prog.report(label, len(reqs))
		res, err := workload.Replay(ctx, workload.Requests(reqs), o)
		prog.done()
		return res, err
	}
	res, err := run(opts, "")
	if err != nil {
		return nil, err
	}
	rep := &benchReport{
		Trace:      f.trace,
		ConfigFile: f.config,
		Params:     opts.Params,
		Opts:       opts,
		Result:     res,
		RefLRU:     workload.ReferenceHitRate(reqs, f.primaryBlocks),
		RefMax:     workload.ReferenceHitRate(reqs, 0),
	}
	if f.plot != "" {
		for _, n := range sizes {
			o := opts
			o.PrimaryBlocks = n
			r, err := run(o, fmt.Sprintf("primary %d: ", n))
			if err != nil {
				return nil, fmt.Errorf("--plot-sizes %d: %w", n, err)
			}
			rep.Sweep = append(rep.Sweep, sweepPoint{n, r.HitRate, workload.ReferenceHitRate(reqs, n)})
		}
		if err := writePlot(f.plot, rep); err != nil {
			return nil, err
		}
	}
	return rep, nil
}

// parseBudget reads --budget: "" (default), "off", or a fraction.
func parseBudget(s string) (tiering.BudgetConfig, error) {
	switch strings.ToLower(s) {
	case "":
		return tiering.BudgetConfig{}, nil
	case "off", "none":
		return tiering.BudgetConfig{Disabled: true}, nil
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || !(v > 0 && v <= 1) {
		return tiering.BudgetConfig{}, fmt.Errorf(`--budget %q: want a share of the primary in (0, 1] or "off"`, s)
	}
	return tiering.BudgetConfig{Fraction: v}, nil
}

// plotSizes returns the primary sizes to sweep for --plot.
func plotSizes(f benchFlags) ([]int, error) {
	if f.plot == "" {
		if f.plotSizes != "" {
			return nil, errors.New("--plot-sizes needs --plot")
		}
		return nil, nil
	}
	if f.plotSizes == "" {
		var out []int
		for _, x := range []float64{0.25, 0.5, 1, 2, 4} {
			out = append(out, max(1, int(x*float64(f.primaryBlocks))))
		}
		return out, nil
	}
	var out []int
	for _, part := range strings.Split(f.plotSizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(part))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("--plot-sizes: %q is not a positive number of blocks", part)
		}
		out = append(out, n)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// readTrace reads the whole trace (up to limit requests) before the
// replay, so that parsing does not count in the replay's throughput.
func readTrace(name string, limit int, stdin io.Reader) ([]workload.Request, error) {
	var r io.Reader = stdin
	if name != "-" {
		f, err := os.Open(name)
		if err != nil {
			return nil, fmt.Errorf("--trace: %w", err)
		}
		defer f.Close()
		r = f
	}
	br := bufio.NewReader(r)
	if magic, _ := br.Peek(2); bytes.Equal(magic, []byte{0x1f, 0x8b}) {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("--trace %s: %w", name, err)
		}
		defer zr.Close()
		r = zr
	} else {
		r = br
	}
	reqs, err := workload.ReadAll(r, workload.ReaderOptions{Limit: limit})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if len(reqs) == 0 {
		return nil, fmt.Errorf("%s: no requests", name)
	}
	return reqs, nil
}

// benchJSON is the --json output: the replay's result, flattened, with
// the trace, the params and the reference figures.
type benchJSON struct {
	Trace  string          `json:"trace"`
	Config string          `json:"config"`
	Params json.RawMessage `json:"params"`
	*workload.Result
	Reference referenceJSON `json:"reference"`
	Sweep     []sweepPoint  `json:"sweep,omitempty"`
}

type referenceJSON struct {
	CapacityBlocks int     `json:"capacity_blocks"`
	LRUHitRate     float64 `json:"lru_hit_rate"`
	MaxHitRate     float64 `json:"max_hit_rate"`
}

func writeBenchJSON(w io.Writer, rep *benchReport, err error) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	if err != nil {
		if werr := enc.Encode(map[string]string{"error": err.Error()}); werr != nil {
			return werr
		}
		return errReported
	}
	params := json.RawMessage("null")
	if len(bytes.TrimSpace(rep.Params)) > 0 {
		var buf bytes.Buffer
		if json.Compact(&buf, rep.Params) == nil {
			params = buf.Bytes()
		}
	}
	return enc.Encode(benchJSON{
		Trace:  rep.Trace,
		Config: rep.ConfigFile,
		Params: params,
		Result: rep.Result,
		Reference: referenceJSON{
			CapacityBlocks: rep.Opts.PrimaryBlocks,
			LRUHitRate:     rep.RefLRU,
			MaxHitRate:     rep.RefMax,
		},
		Sweep: rep.Sweep,
	})
}

func writeBenchText(w io.Writer, rep *benchReport) error {
	r := rep.Result
	var b strings.Builder
	fmt.Fprintf(&b, "trace %s: %d requests, %d blocks of %d tokens\n", rep.Trace, r.Requests, r.Blocks, workload.BlockTokens)
	fmt.Fprintf(&b, "primary: %d blocks of %s, %s\n", r.Primary.Blocks, confvalue.ByteSize(r.Primary.BlockBytes), r.Primary.Policy)
	if len(r.Tiers) == 0 {
		b.WriteString("secondary tiers: none\n")
	} else {
		names := make([]string, len(r.Tiers))
		for i, t := range r.Tiers {
			names[i] = fmt.Sprintf("%s (%s, %s/%s)", t.Name, t.Type, t.Medium, t.Locality)
		}
		fmt.Fprintf(&b, "secondary tiers (config %s): %s\n", rep.ConfigFile, strings.Join(names, ", "))
	}
	if p := bytes.TrimSpace(rep.Params); len(p) > 0 {
		fmt.Fprintf(&b, "params: %s\n", p)
	} else {
		b.WriteString("params: none (the config's default filters apply)\n")
	}
	b.WriteString("\n")

	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "prefix hit rate\t%.4f\t%d of %d blocks\n", r.HitRate, r.HitBlocks, r.Blocks)
	fmt.Fprintf(tw, "  from primary\t%.4f\t%d blocks\n", rate(r.PrimaryHitBlocks, r.Blocks), r.PrimaryHitBlocks)
	for _, t := range r.Tiers {
		fmt.Fprintf(tw, "  promoted from %s\t%.4f\t%d blocks\n", t.Name, rate(t.HitBlocks, r.Blocks), t.HitBlocks)
	}
	if n := r.UnattributedHitBlocks; n > 0 {
		fmt.Fprintf(tw, "  promoted, tier not told apart\t%.4f\t%d blocks (one promotion served several waiting requests)\n", rate(n, r.Blocks), n)
	}
	if n := r.Noise; n != nil {
		quota := "no quotas"
		if n.TraceQuota > 0 {
			quota = fmt.Sprintf("quotas: the trace %d blocks, the neighbour %d", n.TraceQuota, r.Primary.Blocks-n.TraceQuota)
		}
		fmt.Fprintf(tw, "noisy neighbour (%s)\t\t%d blocks per request, %d stored, %d stores refused; %d of the trace's blocks evicted by them\n",
			quota, n.BlocksPerRequest, n.StoredBlocks, n.RejectedStores, n.TraceEvictedByNoise)
	}
	fmt.Fprintf(tw, "reference: plain LRU of %d blocks\t%.4f\t\n", rep.Opts.PrimaryBlocks, rep.RefLRU)
	fmt.Fprintf(tw, "reference: unbounded (maximum)\t%.4f\t\n", rep.RefMax)
	tw.Flush()
	b.WriteString("\n")

	fmt.Fprintf(&b, "primary: %d evictions, %d blocks stored, %d held\n", r.Primary.Evictions, r.Primary.StoredBlocks, r.Primary.Held)
	if len(r.Tiers) > 0 {
		tw = tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintf(tw, "tier\tlookup hits\tskipped\tpromoted\theld before\tcascaded\trevoked\tcascades ok\tfailed\tdropped\tfiltered\tevicted\theld\t\n")
		count := func(n int) string {
			if n < 0 {
				return "?"
			}
			return fmt.Sprint(n)
		}
		for _, t := range r.Tiers {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t\n", t.Name, t.LookupHits, t.SkippedByFilter,
				t.PromotedBlocks, count(t.HeldAtStart), t.CascadedBlocks, t.CascadeBlocksRevoked, t.CascadesOK, t.CascadesFailed,
				t.CascadesDropped, t.CascadesSkippedByFilter, t.Evictions, count(t.Held))
		}
		tw.Flush()
		b.WriteString("(blocks except cascade counts, which are jobs; evicted counts only tiers that emit events; held ≤ held before\n" +
			" + cascaded + revoked: a revoked block stays if the tier had written it before eviction took it back)\n")
		b.WriteString("\ncascades dropped, by reason (jobs):\n")
		tw = tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprint(tw, "tier\t")
		for r := range tiering.NumDropReasons {
			fmt.Fprintf(tw, "%s\t", r)
		}
		fmt.Fprint(tw, "blocks\ttaken back\t\n")
		for _, t := range r.Tiers {
			fmt.Fprintf(tw, "%s\t", t.Name)
			for r := range tiering.NumDropReasons {
				fmt.Fprintf(tw, "%d\t", t.DroppedBy[r.String()])
			}
			fmt.Fprintf(tw, "%d\t%d\t\n", t.CascadeBlocksDropped, t.CascadeBlocksRevoked)
		}
		tw.Flush()
		b.WriteString("(taken back: blocks eviction took from cascades in flight, one by one)\n")
	}
	b.WriteString("\n")
	if tr := r.Timed; tr != nil {
		fmt.Fprintf(&b, "timed: trace span %v at speed-up %g in %v (steps of %v, %d steps, max %v behind), up to %d requests waiting, %d wait steps\n",
			tr.TraceSpan.Round(time.Second), tr.Speedup, r.Elapsed.Round(time.Millisecond), tr.Step, r.Steps,
			tr.MaxBehind.Round(time.Millisecond), tr.MaxWaiting, tr.WaitSteps)
	} else {
		fmt.Fprintf(&b, "throughput: %.0f requests/s, %.0f ns per key (%d requests in %v, %d steps)\n",
			r.RequestsPerSec, r.NsPerKey, r.Requests, r.Elapsed.Round(time.Millisecond), r.Steps)
	}
	if len(rep.Sweep) > 0 {
		b.WriteString("\nhit rate against primary size:\n")
		tw = tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprint(tw, "primary blocks\twith tiers\tplain LRU\t\n")
		for _, p := range rep.Sweep {
			fmt.Fprintf(tw, "%d\t%.4f\t%.4f\t\n", p.PrimaryBlocks, p.HitRate, p.LRUHitRate)
		}
		tw.Flush()
	}
	if r.Unsettled > 0 || r.StoresRejected > 0 {
		fmt.Fprintf(&b, "unsettled lookups: %d, rejected stores: %d\n", r.Unsettled, r.StoresRejected)
	}
	if len(r.Warnings) > 0 {
		fmt.Fprintf(&b, "warnings (%d):\n", len(r.Warnings))
		for _, w := range r.Warnings {
			fmt.Fprintf(&b, "  %s\n", w)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func rate(n, of uint64) float64 {
	if of == 0 {
		return 0
	}
	return float64(n) / float64(of)
}
