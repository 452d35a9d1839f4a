package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// docs/config-reference.md is generated from the configuration's Go types:
// every YAML key, its type and its doc comment, for the daemon's sections
// (package config) and each tier type's keys (the tier packages' Config).
// The test regenerates it and fails on any difference; run it with
// KVTIER_UPDATE_DOCS=1 to write the file after changing a config type.
func TestConfigReferenceIsGenerated(t *testing.T) {
	root := filepath.Join("..", "..")
	got := configReference(t, root)
	path := filepath.Join(root, "docs", "config-reference.md")
	if os.Getenv("KVTIER_UPDATE_DOCS") != "" {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (KVTIER_UPDATE_DOCS=1 go test ./cmd/kvtier -run TestConfigReferenceIsGenerated writes it)", err)
	}
	if string(want) != got {
		t.Fatalf("docs/config-reference.md is not what the config types say: regenerate it with\n  KVTIER_UPDATE_DOCS=1 go test ./cmd/kvtier -run TestConfigReferenceIsGenerated")
	}
}

// structs indexes the struct types of the packages read, by package and
// name.
type structs map[string]map[string]*ast.StructType

func readStructs(t *testing.T, root string, dirs ...string) (structs, map[string]map[string]string) {
	t.Helper()
	out := structs{}
	docs := map[string]map[string]string{}
	for _, dir := range dirs {
		files, err := filepath.Glob(filepath.Join(root, dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		out[dir] = map[string]*ast.StructType{}
		docs[dir] = map[string]string{}
		for _, path := range files {
			if strings.HasSuffix(path, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ParseComments)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range f.Decls {
				g, ok := d.(*ast.GenDecl)
				if !ok || g.Tok != token.TYPE {
					continue
				}
				for _, s := range g.Specs {
					ts := s.(*ast.TypeSpec)
					if st, ok := ts.Type.(*ast.StructType); ok {
						out[dir][ts.Name.Name] = st
						doc := ts.Doc
						if doc == nil {
							doc = g.Doc
						}
						docs[dir][ts.Name.Name] = oneLine(doc.Text())
					}
				}
			}
		}
	}
	return out, docs
}

func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	return strings.ReplaceAll(s, "|", `\|`)
}

func typeName(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.Ident:
		return e.Name
	case *ast.StarExpr:
		return typeName(e.X)
	case *ast.SelectorExpr:
		return typeName(e.X) + "." + e.Sel.Name
	case *ast.ArrayType:
		return "list of " + typeName(e.Elt)
	case *ast.MapType:
		return "map of " + typeName(e.Key) + " to " + typeName(e.Value)
	}
	return fmt.Sprintf("%T", e)
}

// rows appends a row per YAML key of struct name in package dir, under
// prefix, descending into the package's own struct types.
func (s structs) rows(dir, name, prefix string, out *[]string, seen map[string]bool) {
	st := s[dir][name]
	if st == nil || seen[dir+"."+name] {
		return
	}
	seen[dir+"."+name] = true
	defer delete(seen, dir+"."+name)
	for _, f := range st.Fields.List {
		if f.Tag == nil {
			continue
		}
		tag, _ := strconv.Unquote(f.Tag.Value)
		key, opts, _ := strings.Cut(reflect.StructTag(tag).Get("yaml"), ",")
		if key == "-" {
			continue
		}
		inner := typeName(f.Type)
		elem := strings.TrimPrefix(inner, "list of ")
		if opts == "inline" {
			if sel, ok := f.Type.(*ast.SelectorExpr); ok {
				s.rows(inlineDir(sel), sel.Sel.Name, prefix, out, seen)
			}
			continue
		}
		if key == "" {
			continue
		}
		path := prefix + key
		doc := oneLine(f.Doc.Text())
		if doc == "" {
			doc = oneLine(f.Comment.Text())
		}
		if doc == "" && len(*out) > 0 {
			doc = "(with the key above)"
		}
		kind := inner
		if _, nested := s[dir][elem]; nested {
			kind = strings.Replace(inner, elem, "section", 1)
		}
		*out = append(*out, fmt.Sprintf("| `%s` | %s | %s |", path, kind, doc))
		if _, nested := s[dir][elem]; nested {
			sub := path + "."
			if elem != inner {
				sub = path + "[]."
			}
			s.rows(dir, elem, sub, out, seen)
		}
	}
}

// inlineDir is the package directory of an inlined struct from another
// package (the remote tiers' shared keys).
func inlineDir(sel *ast.SelectorExpr) string {
	if id, ok := sel.X.(*ast.Ident); ok && id.Name == "remote" {
		return "tiers/remote"
	}
	return ""
}

func configReference(t *testing.T, root string) string {
	t.Helper()
	s, docs := readStructs(t, root, "config", "tiers/fs", "tiers/s3", "tiers/redis", "tiers/peer", "tiers/remote", "tierset")
	var b strings.Builder
	b.WriteString(`# Configuration reference

Generated from the configuration's Go types (` + "`cmd/kvtier/configref_test.go`" + ` checks it is
current): every key ` + "`kvtier serve --config`" + ` accepts, its type and what it does.
[configuration.md](configuration.md) explains the file; ` + "`kvtier serve --print-default-config`" + `
prints a commented one to start from.

## The daemon

| Key | Type | Meaning |
|---|---|---|
`)
	var rows []string
	s.rows("config", "Config", "", &rows, map[string]bool{})
	b.WriteString(strings.Join(rows, "\n") + "\n")
	for _, tier := range []struct{ typ, dir, name string }{
		{"fs", "tiers/fs", "Config"},
		{"s3", "tiers/s3", "Config"},
		{"redis", "tiers/redis", "Config"},
		{"peer", "tiers/peer", "Config"},
		{"memory", "tierset", "memorySpec"},
	} {
		var rows []string
		s.rows(tier.dir, tier.name, "", &rows, map[string]bool{})
		fmt.Fprintf(&b, "\n## Tier type `%s`\n\nKeys of a `secondary_tiers` entry with `type: %s`, besides `name` and `type`. %s\n\n| Key | Type | Meaning |\n|---|---|---|\n%s\n",
			tier.typ, tier.typ, docs[tier.dir][tier.name], strings.Join(rows, "\n"))
	}
	return b.String()
}
