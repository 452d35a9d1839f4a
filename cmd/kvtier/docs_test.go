package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// Every relative link of the repository's Markdown resolves: the file or
// directory exists, and an anchor names a heading of the file it points
// into (GitHub's slugs). README and BENCHMARKS point into docs/, which
// points back; a moved section must not leave a dead link (issue 45).
func TestMarkdownLinksResolve(t *testing.T) {
	root := filepath.Join("..", "..")
	var files []string
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "dist" || name == "node_modules" ||
				name == "kvtier-data" || name == "serving-bench-out" || strings.HasSuffix(name, ".egg-info")) {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(name, ".md") {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 10 {
		t.Fatalf("only %d Markdown files found", len(files))
	}
	anchors := map[string]map[string]bool{}
	anchorsOf := func(path string) map[string]bool {
		if a, ok := anchors[path]; ok {
			return a
		}
		a := headingSlugs(readFile(t, path))
		anchors[path] = a
		return a
	}
	links := 0
	for _, f := range files {
		for _, l := range markdownLinks(readFile(t, f)) {
			if regexp.MustCompile(`^[a-z]+:`).MatchString(l) {
				continue // a URL
			}
			links++
			target, frag, _ := strings.Cut(l, "#")
			dest := f
			if target != "" {
				dest = filepath.Join(filepath.Dir(f), target)
				if _, err := os.Stat(dest); err != nil {
					t.Errorf("%s: link %q: %v", rel(root, f), l, err)
					continue
				}
			}
			if frag != "" && strings.HasSuffix(dest, ".md") && !anchorsOf(dest)[frag] {
				t.Errorf("%s: link %q: no heading with that anchor in %s", rel(root, f), l, rel(root, dest))
			}
		}
	}
	t.Logf("%d relative links in %d Markdown files", links, len(files))
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func rel(root, path string) string {
	r, err := filepath.Rel(root, path)
	if err != nil {
		return path
	}
	return r
}

var linkRE = regexp.MustCompile(`\[[^\]]*\]\(([^)\s]+)\)`)

// markdownLinks returns the link targets of text outside fenced code and
// code spans.
func markdownLinks(text string) []string {
	var out []string
	fenced := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if fenced {
			continue
		}
		line = regexp.MustCompile("`[^`]*`").ReplaceAllString(line, "")
		for _, m := range linkRE.FindAllStringSubmatch(line, -1) {
			out = append(out, m[1])
		}
	}
	return out
}

// headingSlugs returns the anchors GitHub gives a file's headings: lower
// case, letters, digits, spaces (as '-'), '-' and '_' kept, the rest
// dropped; a repeated slug gets -1, -2, ...
func headingSlugs(text string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	fenced := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		m := regexp.MustCompile(`^#{1,6} (.*)$`).FindStringSubmatch(line)
		if fenced || m == nil {
			continue
		}
		var b strings.Builder
		for _, r := range strings.ToLower(strings.TrimSpace(m[1])) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || isLetterOrDigit(r):
				b.WriteRune(r)
			}
		}
		s := b.String()
		if n := seen[s]; n > 0 {
			out[fmt.Sprintf("%s-%d", s, n)] = true
		} else {
			out[s] = true
		}
		seen[s]++
	}
	return out
}

func isLetterOrDigit(r rune) bool { return unicode.IsLetter(r) || unicode.IsDigit(r) }

// Every section the code and the docs cite — "docs/semantics.md §4.3",
// "docs/design.md §7" — is a heading of that file, and nothing cites the
// design notes outside the repository (issue 45).
func TestSectionReferencesResolve(t *testing.T) {
	root := filepath.Join("..", "..")
	sections := map[string]map[string]bool{}
	for _, doc := range []string{"semantics.md", "design.md"} {
		sections[doc] = map[string]bool{}
		for _, m := range regexp.MustCompile(`(?m)^#{1,6} §([0-9]+(?:\.[0-9]+)?(?:\.[A-G])?) `).FindAllStringSubmatch(readFile(t, filepath.Join(root, "docs", doc)), -1) {
			sections[doc][m[1]] = true
		}
		if len(sections[doc]) < 8 {
			t.Fatalf("docs/%s has %d numbered sections", doc, len(sections[doc]))
		}
	}
	ref := regexp.MustCompile(`docs/(semantics|design)\.md §([0-9]+(?:\.[0-9]+)?(?:\.[A-G])?)`)
	outside := regexp.MustCompile(`\bspec §[0-9]|\bDESIGN\.md|spec/vllm-tiering\.md`)
	refs := 0
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "dist" || d.Name() == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		switch filepath.Ext(path) {
		case ".go", ".py", ".pyi", ".proto", ".md", ".sh", ".yaml", ".yml":
		default:
			return nil
		}
		text := readFile(t, path)
		for _, m := range ref.FindAllStringSubmatch(text, -1) {
			refs++
			if !sections[m[1]+".md"][m[2]] {
				t.Errorf("%s: %q: docs/%s.md has no section §%s", rel(root, path), m[0], m[1], m[2])
			}
		}
		if loc := outside.FindStringIndex(text); loc != nil && !strings.HasSuffix(path, "docs_test.go") {
			t.Errorf("%s: %q cites design notes outside the repository", rel(root, path), text[loc[0]:loc[1]])
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if refs < 50 {
		t.Fatalf("only %d section references found: this test reads too little", refs)
	}
	t.Logf("%d section references resolve", refs)
}
