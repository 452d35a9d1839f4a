package main

import (
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/kvtier/kvtier"

// The import rules that keep the tree's floors apart:
//
//   - the daemon (server) knows tiers only through offload (their contract,
//     their optional capabilities such as offload.Reporter), tiering (the
//     stack) and explain (their declarations): it imports no package under
//     tiers/ and not tierset, which builds them — and neither does anything
//     it imports (TestServerLinksNoTier);
//   - no tier imports another tier's packages: what tiers share is
//     tiers/remote (and its sub-packages) or a leaf package outside tiers/
//     (filemapper, confvalue, asynclookup, vfs).
//
// Test files are not checked: a tier's tests may run against another
// tier, and the server's against real tiers.
func TestImportRules(t *testing.T) {
	imports, err := treeImports(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if len(imports["server"]) == 0 || len(imports["tiers/redis"]) == 0 {
		t.Fatalf("no imports read for server or tiers/redis: %d packages read", len(imports))
	}
	for _, v := range importViolations(imports) {
		t.Error(v)
	}
}

// The daemon's whole import closure links no tier, no tier builder and
// none of the tiers' clients (the AWS SDK, go-redis): what the daemon does
// not use, it does not carry (issue 45).
func TestServerLinksNoTier(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", module+"/server").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	if !slices.Contains(deps, module+"/offload") {
		t.Fatalf("go list -deps ./server names no offload: %q", deps)
	}
	for _, d := range deps {
		rel, ours := strings.CutPrefix(d, module+"/")
		if (ours && (under(rel, "tiers") || rel == "tierset")) ||
			strings.HasPrefix(d, "github.com/aws/") || strings.HasPrefix(d, "github.com/redis/") {
			t.Errorf("server links %s", d)
		}
	}
}

// The kvtier binary, as users build it, links no plotting library: the
// charts of kvtier bench come with -tags charts only (issue 45).
func TestDaemonLinksNoPlotting(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", module+"/cmd/kvtier").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	for _, d := range strings.Fields(string(out)) {
		if strings.HasPrefix(d, "gonum.org/") || d == module+"/workload/plot" {
			t.Errorf("cmd/kvtier links %s", d)
		}
	}
	out, err = exec.Command("go", "list", "-tags", "charts", "-deps", module+"/cmd/kvtier").CombinedOutput()
	if err != nil || !strings.Contains(string(out), module+"/workload/plot") {
		t.Fatalf("with -tags charts, cmd/kvtier links no workload/plot: %v", err)
	}
}

// The rules catch what they are for.
func TestImportRulesCatchViolations(t *testing.T) {
	got := importViolations(map[string][]string{
		"server":               {"offload", "tierset", "tiers/fs"},
		"tiers/s3":             {"tiers/fs", "tiers/remote", "filemapper"},
		"tiers/redis":          {"tiers/redis/slotpipe", "tiers/remote/remotetest", "tiers/peer"},
		"tiers/redis/slotpipe": {"tiers/memory"},
		"tiers/remote":         {"offload"},
		"tiers/peer":           {"client", "tiers/remote"},
	})
	want := []string{
		"server imports tiers/fs: the daemon knows tiers through offload, tiering and explain only",
		"server imports tierset: the daemon knows tiers through offload, tiering and explain only",
		"tiers/redis imports tiers/peer: a tier imports no other tier's package (share through tiers/remote or a leaf package)",
		"tiers/redis/slotpipe imports tiers/memory: a tier imports no other tier's package (share through tiers/remote or a leaf package)",
		"tiers/s3 imports tiers/fs: a tier imports no other tier's package (share through tiers/remote or a leaf package)",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("violations:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// treeImports returns, for each package directory of the module under
// root (relative, slash-separated), the module packages its non-test Go
// files import (relative too).
func treeImports(root string) (map[string][]string, error) {
	out := map[string][]string{}
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" || name == "python") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		dir, _ := filepath.Rel(root, filepath.Dir(path))
		dir = filepath.ToSlash(dir)
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if rel, ok := strings.CutPrefix(p, module+"/"); ok && !slices.Contains(out[dir], rel) {
				out[dir] = append(out[dir], rel)
			}
		}
		if out[dir] == nil {
			out[dir] = []string{}
		}
		return nil
	})
	return out, err
}

// importViolations checks the rules of TestImportRules, sorted.
func importViolations(imports map[string][]string) []string {
	var out []string
	for pkg, deps := range imports {
		for _, dep := range deps {
			switch {
			case pkg == "server" && (under(dep, "tiers") || dep == "tierset"):
				out = append(out, pkg+" imports "+dep+": the daemon knows tiers through offload, tiering and explain only")
			case under(pkg, "tiers") && !under(pkg, "tiers/remote") && under(dep, "tiers") &&
				!under(dep, "tiers/remote") && tierOf(dep) != tierOf(pkg):
				out = append(out, pkg+" imports "+dep+": a tier imports no other tier's package (share through tiers/remote or a leaf package)")
			}
		}
	}
	slices.Sort(out)
	return out
}

// under reports whether pkg is dir or below it.
func under(pkg, dir string) bool { return pkg == dir || strings.HasPrefix(pkg, dir+"/") }

// tierOf returns the tier a package under tiers/ belongs to: tiers/<name>.
func tierOf(pkg string) string {
	parts := strings.SplitN(pkg, "/", 3)
	if len(parts) < 2 {
		return pkg
	}
	return parts[0] + "/" + parts[1]
}
