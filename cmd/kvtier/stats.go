package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"

	kvtierv1 "github.com/kvtier/kvtier/api/kvtier/v1"
	"github.com/kvtier/kvtier/confvalue"
	"github.com/kvtier/kvtier/offload"
)

func newStatsCmd() *cobra.Command {
	var rf remoteFlags
	var asJSON bool
	var tenant string
	cmd := &cobra.Command{
		Use:   "stats [flags] [--json] [--tenant NAME]",
		Short: "Show a running daemon's primary and tiers",
		Long: `stats prints the namespace's primary tier (slots, hits, evictions), its
requests and sessions, and one row per secondary tier: health, back-pressure,
blocks and bytes held, lookups, promotions, and cascades by result with the
dropped ones by reason, then one row per tenant and shared space when the
daemon has them. --tenant prints one tenant's row only: its primary bytes
and quota, its blocks evicted (by its own stores and by others'), hits,
misses, blocks stored and refusals. With a tenant's token, stats shows that
tenant's row and nothing else. --json prints the daemon's Stats answer as
JSON (field names as in api/kvtier/v1/kvtier.proto).`,
		Example: `  kvtier stats
  kvtier stats --target 127.0.0.1:7070 --token "$TOKEN" --json
  kvtier stats --target 127.0.0.1:7070 --token "$TOKEN" --tenant acme`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := rf.dial()
			if err != nil {
				return err
			}
			defer c.Close()
			ctx, cancel := rf.context(0)
			defer cancel()
			st, err := c.Stats(ctx)
			if err != nil {
				return rf.rpcError("stats", err)
			}
			w := cmd.OutOrStdout()
			if tenant != "" {
				ts := slices.DeleteFunc(st.GetTenants(), func(t *kvtierv1.TenantStats) bool { return t.GetName() != tenant })
				if len(ts) == 0 {
					return fmt.Errorf("stats: the daemon has no tenant %q (or your token is another tenant's)", tenant)
				}
				st = &kvtierv1.StatsResponse{Namespace: st.GetNamespace(), Tenants: ts}
			}
			if asJSON {
				b, err := protojson.MarshalOptions{Multiline: true, UseProtoNames: true, EmitUnpopulated: true}.Marshal(st)
				if err != nil {
					return err
				}
				_, err = fmt.Fprintln(w, string(b))
				return err
			}
			if st.GetPrimary().GetNumSlots() == 0 && len(st.GetTenants()) > 0 {
				printTenants(w, st.GetTenants()) // a tenant's view, or --tenant
				return nil
			}
			printStats(w, st)
			if len(st.GetTenants()) > 0 {
				fmt.Fprintln(w)
				printTenants(w, st.GetTenants())
			}
			return nil
		},
	}
	rf.register(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the Stats answer as JSON")
	cmd.Flags().StringVar(&tenant, "tenant", "", "print only this tenant's (or shared space's) figures")
	return cmd
}

func printStats(w io.Writer, st *kvtierv1.StatsResponse) {
	p := st.GetPrimary()
	ns := st.GetNamespace()
	if ns == "" {
		ns = "(default)"
	}
	fmt.Fprintf(w, "namespace %s\n", ns)
	fmt.Fprintf(w, "primary   %d slots of %s: %d used, %d pinned, %d pending, %d revocable; %d hits, %d misses%s; %d evictions, %d stores rejected\n",
		p.GetNumSlots(), confvalue.ByteSize(p.GetSlotSize()).Approx(), p.GetUsedSlots(), p.GetPinnedSlots(), p.GetPendingSlots(), p.GetRevocableSlots(),
		p.GetHits(), p.GetMisses(), ratio(p.GetHits(), p.GetHits()+p.GetMisses()), p.GetEvictions(), p.GetStoresRejected())
	budget := "unbounded"
	if b := st.GetCascadePinBudget(); b > 0 {
		budget = fmt.Sprintf("of %d", b)
	}
	fmt.Fprintf(w, "requests  %d active in %d sessions; %d released when their session ended, %d expired; %d auto steps\n",
		st.GetActiveRequests(), st.GetSessions(), st.GetReleasedRequests(), st.GetExpiredRequests(), st.GetAutoSteps())
	fmt.Fprintf(w, "cascades  %d slots pinned (%s), %d revoked by stores\n", st.GetCascadePinnedSlots(), budget, st.GetCascadeRevocations())
	if n := st.GetRouterPinnedBlocks(); n > 0 {
		fmt.Fprintf(w, "pins      %d blocks pinned by routers and agents (kvtier pin)\n", n)
	}
	if len(st.GetTiers()) == 0 {
		fmt.Fprintln(w, "no secondary tiers")
		return
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TIER\tTYPE\tMEDIUM\tLOCALITY\tHEALTHY\tPRESSURE\tBLOCKS\tBYTES\tEVICTED\tHITS\tMISSES\tPROMOTED ok/failed\tCASCADES ok/failed/dropped/filtered\tDROPPED BY REASON")
	for _, t := range st.GetTiers() {
		blocks, bytes := "?", "?"
		if t.GetBlocks() >= 0 {
			blocks = fmt.Sprint(t.GetBlocks())
		}
		if t.GetBytes() >= 0 {
			bytes = confvalue.ByteSize(t.GetBytes()).Approx()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d/%d\t%d/%d/%d/%d\t%s\n",
			t.GetName(), t.GetType(), mediumWord(t.GetMedium()), localityWord(t.GetLocality()),
			yesNo(t.GetHealthy()), yesNo(t.GetUnderPressure()), blocks, bytes, t.GetEvictions(),
			t.GetHits(), t.GetMisses(), t.GetPromotionsOk(), t.GetPromotionsFailed(),
			t.GetCascadesOk(), t.GetCascadesFailed(), t.GetCascadesDropped(), t.GetCascadesFiltered(),
			droppedBy(t.GetCascadesDroppedByReason()))
	}
	tw.Flush()
}

// printTenants prints one row per tenant or shared space.
func printTenants(w io.Writer, ts []*kvtierv1.TenantStats) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TENANT	KIND	PRIMARY	QUOTA	EVICTED self/others	HITS	MISSES	STORED	REFUSED	TIERS (held/quota)")
	for _, t := range ts {
		kind := "tenant"
		if t.GetShared() {
			kind = "shared"
		}
		tiers := "-"
		if len(t.GetTiers()) > 0 {
			parts := make([]string, len(t.GetTiers()))
			for i, tt := range t.GetTiers() {
				parts[i] = fmt.Sprintf("%s %s/%s", tt.GetTier(), confvalue.ByteSize(tt.GetBytes()).Approx(), confvalue.ByteSize(tt.GetQuotaBytes()).Approx())
			}
			tiers = strings.Join(parts, ", ")
		}
		fmt.Fprintf(tw, "%s	%s	%s	%s	%d/%d	%d	%d	%d	%d	%s\n",
			t.GetName(), kind, confvalue.ByteSize(t.GetPrimaryBytes()).Approx(), confvalue.ByteSize(t.GetPrimaryQuotaBytes()).Approx(),
			t.GetEvicted()-t.GetEvictedByOthers(), t.GetEvictedByOthers(), t.GetHits(), t.GetMisses(), t.GetStored(), t.GetRefusals(), tiers)
	}
	tw.Flush()
}

func ratio(a, b uint64) string {
	if b == 0 {
		return ""
	}
	return fmt.Sprintf(" (%.1f%% hits)", 100*float64(a)/float64(b))
}

// droppedBy renders the non-zero reasons, "-" when none.
func droppedBy(m map[string]uint64) string {
	var parts []string
	for r, n := range m {
		if n > 0 {
			parts = append(parts, fmt.Sprintf("%s=%d", r, n))
		}
	}
	if len(parts) == 0 {
		return "-"
	}
	slices.Sort(parts)
	return strings.Join(parts, ",")
}

func mediumWord(m kvtierv1.Medium) string {
	switch m {
	case kvtierv1.Medium_MEDIUM_CPU:
		return offload.MediumCPU.String()
	case kvtierv1.Medium_MEDIUM_STORAGE:
		return offload.MediumStorage.String()
	}
	return "dynamic"
}

func localityWord(l kvtierv1.Locality) string {
	switch l {
	case kvtierv1.Locality_LOCALITY_LOCAL:
		return offload.LocalityLocal.String()
	case kvtierv1.Locality_LOCALITY_REMOTE:
		return offload.LocalityRemote.String()
	}
	return "dynamic"
}
