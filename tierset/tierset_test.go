package tierset

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvtier/kvtier/config"
	"github.com/kvtier/kvtier/explain"
	"github.com/kvtier/kvtier/keyspace"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/quota"
)

// fourTiers is the filter-examples stack of the design discussion, every
// tier an in-memory stand-in.
const fourTiers = `
secondary_tiers:
  - {name: local-ssd, type: memory, medium: storage, locality: local}
  - {name: s3, type: memory, medium: STORAGE, locality: Remote}
  - {name: redis, type: memory, medium: cpu, locality: remote}
  - {name: peer, type: memory}
`

func mustParse(t *testing.T, doc string) *config.Config {
	t.Helper()
	cfg, err := config.Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestDeclare(t *testing.T) {
	decls, err := Declare(mustParse(t, fourTiers+"  - {type: memory, locality: local, capacity_blocks: 10, latency: 2MS, fail_rate: 0.1, async_lookup: true, events: true, seed: 3}\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := []explain.Declaration{
		{Name: "local-ssd", Type: "memory", Medium: offload.MediumStorage, Locality: offload.LocalityLocal},
		{Name: "s3", Type: "memory", Medium: offload.MediumStorage, Locality: offload.LocalityRemote},
		{Name: "redis", Type: "memory", Medium: offload.MediumCPU, Locality: offload.LocalityRemote},
		{Name: "peer", Type: "memory", Medium: offload.MediumUnspecified, Locality: offload.LocalityUnspecified},
		{Name: "memory4", Type: "memory", Medium: offload.MediumUnspecified, Locality: offload.LocalityLocal},
	}
	if !slices.Equal(decls, want) {
		t.Errorf("Declare = %v\nwant      %v", decls, want)
	}
	if got := decls[3].String(); got != "peer (memory, dynamic/dynamic)" {
		t.Errorf("String = %q", got)
	}
}

func TestDeclareErrors(t *testing.T) {
	cases := []struct {
		name string
		doc  string
		want []string
	}{
		{"unknown type", "secondary_tiers: [{type: memory}, {name: disk, type: floppy}]\n",
			[]string{`secondary_tiers[1].type: unknown tier type "floppy" (supported: fs, memory, peer, redis, s3)`}},
		{"bad medium", "secondary_tiers: [{type: memory, medium: moon}]\n",
			[]string{`secondary_tiers[0].medium: invalid value "moon" (want cpu or storage)`}},
		{"bad locality", "secondary_tiers: [{type: memory}, {type: memory, locality: moon}]\n",
			[]string{`secondary_tiers[1].locality: invalid value "moon" (want local or remote)`}},
		{"unknown memory key", "secondary_tiers: [{type: memory, path: /tmp}]\n",
			[]string{`secondary_tiers[0].path: unknown key (want one of: name, type, medium, locality, capacity_blocks, latency, block_latency, concurrency, queue_depth, fail_rate, async_lookup, events, seed)`}},
		{"negative capacity and bad fail rate", "secondary_tiers: [{type: memory, capacity_blocks: -1, fail_rate: 1.5}]\n",
			[]string{`secondary_tiers[0].capacity_blocks: must not be negative, got -1`, `secondary_tiers[0].fail_rate: must be in [0, 1], got 1.5`}},
		{"bad latency", "secondary_tiers: [{type: memory, latency: soon}]\n",
			[]string{`secondary_tiers[0].latency: invalid value "soon" (want a duration such as 250ms or 2s)`}},
		{"every tier reported", "secondary_tiers: [{type: tape}, {type: memory, medium: gpu}]\n",
			[]string{`secondary_tiers[0].type: unknown tier type "tape"`, `secondary_tiers[1].medium: invalid value "gpu"`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := mustParse(t, tc.doc)
			_, err := Declare(cfg)
			if err == nil {
				t.Fatalf("Declare succeeded, want %q", tc.want)
			}
			rest := err.Error()
			for _, w := range tc.want {
				i := strings.Index(rest, w)
				if i < 0 {
					t.Fatalf("error %q does not contain %q (in order)", err, w)
				}
				rest = rest[i+len(w):]
			}
			if _, berr := Build(context.Background(), cfg, Options{}); berr == nil || berr.Error() != err.Error() {
				t.Errorf("Build error %v, want the Declare error", berr)
			}
		})
	}
}

func TestBuildMemory(t *testing.T) {
	ctx := context.Background()
	cfg := mustParse(t, fourTiers)
	tiers, err := Build(ctx, cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	decls, err := Declare(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(tiers) != len(decls) {
		t.Fatalf("built %d tiers, declared %d", len(tiers), len(decls))
	}
	for i, tier := range tiers {
		if got := explain.DeclarationOf(tier); got != decls[i] {
			t.Errorf("tier %d declares %v, want %v", i, got, decls[i])
		}
		if err := tier.Close(ctx); err != nil {
			t.Errorf("close %s: %v", tier.Name(), err)
		}
	}
}

// fakeTier records Close; its other methods are never called here.
type fakeTier struct {
	offload.SecondaryTier
	decl   explain.Declaration
	closed *[]string
}

func (f *fakeTier) Name() string               { return f.decl.Name }
func (f *fakeTier) Type() string               { return f.decl.Type }
func (f *fakeTier) Medium() offload.Medium     { return f.decl.Medium }
func (f *fakeTier) Locality() offload.Locality { return f.decl.Locality }
func (f *fakeTier) Close(context.Context) error {
	*f.closed = append(*f.closed, f.decl.Name)
	return nil
}

func TestBuildClosesBuiltTiersOnFailure(t *testing.T) {
	cfg := mustParse(t, "secondary_tiers: [{name: a, type: memory}, {name: b, type: memory}, {name: c, type: memory}, {name: d, type: memory}]\n")
	var closed []string
	boom := errors.New("boom")
	ok := func(name string) plan {
		d := explain.Declaration{Name: name, Type: "fake"}
		return plan{decl: d, build: func(context.Context, Options) (offload.SecondaryTier, error) {
			return &fakeTier{decl: d, closed: &closed}, nil
		}}
	}
	lying := ok("c")
	lying.decl.Medium = offload.MediumCPU // the built tier declares no medium

	_, err := buildPlans(context.Background(), cfg.SecondaryTiers, []plan{ok("a"), ok("b"),
		{decl: explain.Declaration{Name: "c"}, build: func(context.Context, Options) (offload.SecondaryTier, error) { return nil, boom }}, ok("d")}, Options{})
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "secondary_tiers[2] (c): boom") {
		t.Errorf("error = %v", err)
	}
	if want := []string{"b", "a"}; !slices.Equal(closed, want) {
		t.Errorf("closed %v, want %v", closed, want)
	}

	closed = nil
	_, err = buildPlans(context.Background(), cfg.SecondaryTiers, []plan{ok("a"), lying}, Options{})
	if err == nil || !strings.Contains(err.Error(), "secondary_tiers[1] (c): built tier declares c (fake, dynamic/dynamic), config declares c (fake, CPU/dynamic)") {
		t.Errorf("error = %v", err)
	}
	if want := []string{"c", "a"}; !slices.Equal(closed, want) {
		t.Errorf("closed %v, want %v", closed, want)
	}
}

func TestFS(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	cfg := mustParse(t, fmt.Sprintf(`
namespace: {model: m, bytes_per_block: 4KiB}
primary: {bytes: 1MiB}
secondary_tiers:
  - {name: ssd, type: fs, root_dir: %q, locality: LOCAL, max_bytes: 1MiB, namespace: {tp_size: 2}}
  - {name: nfs, type: fs, root_dir: %q, locality: remote}
  - {name: scratch, type: fs, root_dir: %q}
`, filepath.Join(root, "a"), filepath.Join(root, "b"), filepath.Join(root, "c")))
	decls, err := Declare(cfg)
	if err != nil {
		t.Fatal(err)
	}
	want := []explain.Declaration{
		{Name: "ssd", Type: "fs", Medium: offload.MediumStorage, Locality: offload.LocalityLocal},
		{Name: "nfs", Type: "fs", Medium: offload.MediumStorage, Locality: offload.LocalityRemote},
		{Name: "scratch", Type: "fs", Medium: offload.MediumStorage, Locality: offload.LocalityLocal}, // fs defaults to local
	}
	if !slices.Equal(decls, want) {
		t.Errorf("Declare = %v, want %v", decls, want)
	}
	tiers, err := Build(ctx, cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for i, tier := range tiers {
		if got := explain.DeclarationOf(tier); got != want[i] {
			t.Errorf("built %v, want %v", got, want[i])
		}
		if err := tier.Close(ctx); err != nil {
			t.Error(err)
		}
	}

	for _, tc := range []struct{ tier, want string }{
		{"{type: fs}", `secondary_tiers[0].root_dir: required`},
		{"{type: fs, root_dir: /x, locality: moon}", `secondary_tiers[0].locality: invalid value "moon" (want local or remote)`},
		{"{type: fs, root_dir: /x, medium: cpu}", `secondary_tiers[0].medium: unknown key (want one of: name, type, root_dir, locality,`},
		{"{type: fs, root_dir: /x, namespace: {tp: 2}}", `secondary_tiers[0].namespace.tp: unknown key`},
	} {
		_, err := Declare(mustParse(t, "secondary_tiers: ["+tc.tier+"]\n"))
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("Declare(%s) = %v, want %s...", tc.tier, err, tc.want)
		}
	}
	// What only fs.New can judge fails Build, naming the entry.
	_, err = Build(ctx, mustParse(t, fmt.Sprintf("secondary_tiers: [{name: x, type: fs, root_dir: %q, o_direct: maybe}]\n", root)), Options{})
	if err == nil || !strings.HasPrefix(err.Error(), "secondary_tiers[0] (x): ") || !strings.Contains(err.Error(), "maybe") {
		t.Errorf("Build with a bad o_direct: %v", err)
	}
}

func TestTypes(t *testing.T) {
	if got := Types(); !slices.Equal(got, []string{"fs", "memory", "peer", "redis", "s3"}) || !slices.IsSorted(got) {
		t.Errorf("Types = %v", got)
	}
}

// Tenants' quota.tiers reach the fs tier they name as shares of its
// capacity, each under its key space.
func TestTenantQuotasReachTheFSTier(t *testing.T) {
	cfg, err := config.Parse([]byte(`
secondary_tiers:
  - {name: disk, type: fs, root_dir: /tmp/kvtier-quota-test, max_bytes: 1GiB}
  - {name: other, type: fs, root_dir: /tmp/kvtier-quota-test2}
tenants:
  - {name: acme, token: acme-token-0123456789, namespaces: [default], quota: {tiers: {disk: 100MiB}}, weight: 2}
  - {name: beta, token: beta-token-0123456789, namespaces: [default]}
shared_spaces:
  - {name: prompts, tenants: [acme], quota: {tiers: {disk: 10MiB}}}
`))
	if err != nil {
		t.Fatal(err)
	}
	fcs, err := FSTiers(cfg)
	if err != nil {
		t.Fatal(err)
	}
	acme, _ := keyspace.Tenant("acme")
	prompts, _ := keyspace.Shared("prompts")
	want := []quota.Share{{Space: acme.ID(), Quota: 100 << 20, Weight: 2}, {Space: prompts.ID(), Quota: 10 << 20}}
	if !slices.Equal(fcs[0].Shares, want) || fcs[1].Shares != nil {
		t.Fatalf("shares %+v and %+v, want %+v and none", fcs[0].Shares, fcs[1].Shares, want)
	}
}

// A memory tier with capacity_blocks divides it between the tenants'
// quotas, rounded down to whole blocks of the namespace's size.
func TestTenantQuotasReachTheMemoryTier(t *testing.T) {
	cfg, err := config.Parse([]byte(`
namespace: {bytes_per_block: 1MiB}
secondary_tiers:
  - {name: scratch, type: memory, capacity_blocks: 8}
tenants:
  - {name: acme, token: acme-token-0123456789, namespaces: [default], quota: {tiers: {scratch: 2.5MiB}}}
`))
	if err != nil {
		t.Fatal(err)
	}
	tiers, err := Build(t.Context(), cfg, Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll(t.Context(), tiers)
	acme, _ := keyspace.Tenant("acme")
	rep := tiers[0].(offload.Reporter).Report()
	want := []offload.ShareReport{{Space: 0, Quota: 6 << 20}, {Space: acme.ID(), Quota: 2 << 20}}
	if !slices.Equal(rep.Shares, want) {
		t.Fatalf("shares %+v, want %+v", rep.Shares, want)
	}
}
