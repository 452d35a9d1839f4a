package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/kvtier/kvtier/config"
	"github.com/kvtier/kvtier/tierset"
)

// The README and the documentation in docs/ cannot drift from the code:
// every config key their tables name is accepted by the parser at the
// place the table puts it, and every kvtier command and flag they show
// exists.

// readme returns README.md and docs/*.md, one after the other.
func readme(t *testing.T) string {
	t.Helper()
	root := filepath.Join("..", "..")
	docs, _ := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	var all strings.Builder
	for _, f := range append([]string{filepath.Join(root, "README.md")}, docs...) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		all.Write(b)
		all.WriteString("\n")
	}
	return all.String()
}

// The README is read in five minutes and BENCHMARKS.md is a table: the
// rest lives in docs/ (issue 45).
func TestREADMEAndBenchmarksAreShort(t *testing.T) {
	for file, most := range map[string]int{"README.md": 250, "BENCHMARKS.md": 100} {
		b, err := os.ReadFile(filepath.Join("..", "..", file))
		if err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(string(b), "\n"); n > most {
			t.Errorf("%s has %d lines, at most %d: move detail into docs/", file, n, most)
		}
	}
}

var (
	backticked = regexp.MustCompile("`([^`]+)`")
	keyToken   = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)
	mdLink     = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)
)

// tableKeys returns the keys a table cell names: the first backticked
// token of each comma- or semicolon-separated item outside parentheses
// (later tokens of an item are its values: "`policy` `lru`|`arc`"), and
// the members of a "`key: {a, b}`" or "`key` `{a: …, b}`" form as
// "key.a", "key.b".
func tableKeys(cell string) []string {
	cell = mdLink.ReplaceAllString(strings.ReplaceAll(cell, `\|`, "/"), "$1")
	var items []string
	depth, start := 0, 0
	inTick := false
	for i, r := range cell {
		switch {
		case r == '`':
			inTick = !inTick
		case inTick:
		case r == '(':
			if depth == 0 {
				items = append(items, cell[start:i])
			}
			depth++
		case r == ')':
			if depth > 0 {
				depth--
			}
			start = i + 1
		case depth == 0 && (r == ',' || r == ';'):
			items = append(items, cell[start:i])
			start = i + 1
		}
	}
	items = append(items, cell[start:])
	var keys []string
	for _, it := range items {
		toks := backticked.FindAllStringSubmatch(it, -1)
		if len(toks) == 0 {
			continue
		}
		first := strings.TrimSpace(toks[0][1])
		name, inner, structured := strings.Cut(first, ":")
		switch {
		case structured && keyToken.MatchString(name) && strings.Contains(inner, "{"):
			keys = append(keys, name)
			keys = append(keys, members(name, inner)...)
		case keyToken.MatchString(first):
			keys = append(keys, first)
			if len(toks) > 1 && strings.HasPrefix(strings.TrimSpace(toks[1][1]), "{") {
				keys = append(keys, members(first, toks[1][1])...)
			}
		}
	}
	return keys
}

// members returns "parent.m" for each member of a "{m1: …, m2}" or
// "[{m1, m2}]" form (one level).
func members(parent, form string) []string {
	form = strings.Trim(strings.TrimSpace(form), "[]")
	open, closeAt := strings.Index(form, "{"), strings.LastIndex(form, "}")
	if open < 0 || closeAt < open {
		return nil
	}
	var out []string
	depth, start := 0, open+1
	body := form[:closeAt]
	for i := open + 1; i <= len(body); i++ {
		if i < len(body) {
			switch body[i] {
			case '{', '[':
				depth++
				continue
			case '}', ']':
				depth--
				continue
			case ',':
				if depth > 0 {
					continue
				}
			default:
				continue
			}
		}
		m, _, _ := strings.Cut(strings.TrimSpace(body[start:i]), ":")
		if m = strings.TrimSpace(m); keyToken.MatchString(m) {
			out = append(out, parent+"."+m)
		}
		start = i + 1
	}
	return out
}

// tableRows returns the rows (cells) of the markdown table that follows
// the line holding header.
func tableRows(t *testing.T, doc, header string) [][]string {
	t.Helper()
	i := strings.Index(doc, header)
	if i < 0 {
		t.Fatalf("README has no table with header %q", header)
	}
	var rows [][]string
	for _, line := range strings.Split(doc[i:], "\n")[2:] {
		if !strings.HasPrefix(line, "|") {
			break
		}
		// Split on | outside backticks (\| inside a cell is a literal).
		var cells []string
		var cur strings.Builder
		tick := false
		for j := 0; j < len(line); j++ {
			c := line[j]
			switch {
			case c == '\\' && j+1 < len(line) && line[j+1] == '|':
				cur.WriteString(`\|`)
				j++
			case c == '`':
				tick = !tick
				cur.WriteByte(c)
			case c == '|' && !tick:
				cells = append(cells, strings.TrimSpace(cur.String()))
				cur.Reset()
			default:
				cur.WriteByte(c)
			}
		}
		rows = append(rows, cells[1:])
	}
	return rows
}

// yamlAt renders key path p (a.b) with a null value, nested in flow maps.
func yamlAt(p string) string {
	parts := strings.Split(p, ".")
	s := parts[len(parts)-1] + ": null"
	for i := len(parts) - 2; i >= 0; i-- {
		s = parts[i] + ": {" + s + "}"
	}
	return s
}

// unknownKey reports whether parsing doc (and decoding its tiers, as
// `kvtier explain` does) failed because of an unknown key.
func unknownKey(doc string) (bool, string) {
	cfg, err := config.Parse([]byte(doc))
	if err == nil {
		_, err = tierset.Declare(cfg)
	}
	if err != nil && strings.Contains(err.Error(), "unknown key") {
		return true, err.Error()
	}
	return false, ""
}

func TestREADMEConfigKeysExist(t *testing.T) {
	doc := readme(t)
	checked := 0
	for _, row := range tableRows(t, doc, "| Key | Meaning (default) |") {
		for _, sec := range backticked.FindAllStringSubmatch(row[0], -1) {
			section := sec[1]
			if !keyToken.MatchString(section) {
				continue
			}
			if bad, msg := unknownKey(section + ": null"); bad {
				t.Errorf("README configuration table: section %q: %s", section, msg)
			}
			if section == "secondary_tiers" || section == "default_load_tiers" || section == "default_store_tiers" || section == "validation" {
				continue // lists and scalars: their keys are in the tier table
			}
			for _, k := range tableKeys(row[1]) {
				checked++
				if bad, msg := unknownKey(yamlAt(section + "." + k)); bad {
					t.Errorf("README configuration table: %s.%s: %s", section, k, msg)
				}
			}
		}
	}
	for _, row := range tableRows(t, doc, "| `type` | medium | keys (see the package docs) |") {
		m := backticked.FindStringSubmatch(row[0])
		if m == nil {
			continue
		}
		typ := m[1]
		for _, k := range tableKeys(row[2]) {
			checked++
			entry := "{type: " + typ + ", " + yamlAt(k) + "}"
			if bad, msg := unknownKey("secondary_tiers: [" + entry + "]"); bad {
				t.Errorf("README tier table: %s tier key %s: %s", typ, k, msg)
			}
		}
	}
	t.Logf("%d README config keys checked", checked)
	if checked < 60 {
		t.Fatalf("only %d README config keys found: the tables' format changed and this test reads too little", checked)
	}
}

var kvtierCmd = regexp.MustCompile(`(?:^|[\s(` + "`" + `])(?:python -m )?kvtier ([a-z][a-z-]*(?: [a-z][a-z-]*)*)((?: [^\s` + "`" + `|]+)*)`)

// commandLines returns the kvtier command lines the README shows: in sh
// blocks and in inline code.
func commandLines(doc string) []string {
	var lines []string
	inSh := false
	for _, line := range strings.Split(doc, "\n") {
		switch {
		case strings.HasPrefix(line, "```sh"):
			inSh = true
			continue
		case strings.HasPrefix(line, "```"):
			inSh = false
			continue
		}
		if inSh {
			code, _, _ := strings.Cut(line, " #")
			lines = append(lines, code)
			continue
		}
		for _, m := range backticked.FindAllStringSubmatch(line, -1) {
			lines = append(lines, m[1])
		}
	}
	var out []string
	for _, l := range lines {
		if strings.Contains(l, "kvtier ") {
			out = append(out, l)
		}
	}
	return out
}

func TestREADMECommandsAndFlagsExist(t *testing.T) {
	root := newRootCmd(strings.NewReader(""), io.Discard, io.Discard)
	checked := 0
	for _, line := range commandLines(readme(t)) {
		for _, m := range kvtierCmd.FindAllStringSubmatch(line, -1) {
			words := strings.Fields(m[1] + m[2])
			cmd, rest, err := root.Find(words)
			if err != nil || cmd == root {
				// "kvtier is …" in prose; a real command line names a
				// subcommand as its first word.
				if len(words) > 0 && isCommandWord(root, words[0]) {
					t.Errorf("README: %q: %v", line, err)
				}
				continue
			}
			checked++
			for _, w := range rest {
				if !strings.HasPrefix(w, "--") {
					continue
				}
				name, _, _ := strings.Cut(strings.TrimPrefix(w, "--"), "=")
				name = strings.TrimRight(name, ".,;:)")
				if name == "" || name == "help" {
					continue
				}
				if cmd.Flags().Lookup(name) == nil && cmd.InheritedFlags().Lookup(name) == nil {
					t.Errorf("README: %q: `%s` has no flag --%s", line, cmd.CommandPath(), name)
				}
			}
		}
	}
	t.Logf("%d README command lines checked", checked)
	if checked < 15 {
		t.Fatalf("only %d README command lines found: this test reads too little", checked)
	}
}

func isCommandWord(root *cobra.Command, w string) bool {
	for _, c := range root.Commands() {
		if c.Name() == w {
			return true
		}
	}
	return false
}

// The checks catch what they are for: a renamed key, a flag that is gone.
func TestREADMEChecksCatchDrift(t *testing.T) {
	if k := tableKeys("`unix_socket` (`./kvtier.sock`), `tcp_adr` (`127.0.0.1:7070`), `policy` `lru`\\|`arc`, `tls: {cert_file, key_file}`"); fmt.Sprint(k) != "[unix_socket tcp_adr policy tls tls.cert_file tls.key_file]" {
		t.Fatalf("keys %v", k)
	}
	if bad, _ := unknownKey(yamlAt("server.tcp_adr")); !bad {
		t.Fatal("a misspelt key passed")
	}
	root := newRootCmd(strings.NewReader(""), io.Discard, io.Discard)
	cmd, _, err := root.Find([]string{"stats"})
	if err != nil || cmd.Flags().Lookup("tls-certificate") != nil {
		t.Fatal("a flag that does not exist was found")
	}
	var buf bytes.Buffer
	buf.WriteString("```sh\nkvtier stats --tls-certificate x\n```\n")
	if lines := commandLines(buf.String()); len(lines) != 1 {
		t.Fatalf("command lines %q", lines)
	}
}

// Every package of the tree has a row in the README's Layout table (a
// package directory named there, or its parent: `tiers/fs` is under
// `tiers/memory`, `tiers/fs`, …).
func TestREADMELayoutNamesEveryPackage(t *testing.T) {
	doc := readme(t)
	i := strings.Index(doc, "\n# Layout\n")
	if i < 0 {
		t.Fatal("docs/layout.md has no Layout section")
	}
	layout := doc[i+1:]
	if j := strings.Index(layout[1:], "\n# "); j >= 0 {
		layout = layout[:j+1]
	}
	named := map[string]bool{}
	for _, m := range backticked.FindAllStringSubmatch(layout, -1) {
		for _, p := range strings.Split(m[1], ",") {
			named[strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(p), "/…"))] = true
		}
	}
	root := filepath.Join("..", "..")
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && rel != "." || d.Name() == "testdata" || rel == "python" || rel == "docs" ||
			rel == "examples" || rel == "dist" || strings.HasPrefix(rel, "serving-bench-out")) {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		pkg := filepath.ToSlash(filepath.Dir(rel))
		for q := pkg; q != "."; q = filepath.ToSlash(filepath.Dir(q)) {
			if named[q] {
				return nil
			}
		}
		t.Errorf("package %s has no row in the README's Layout table", pkg)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
