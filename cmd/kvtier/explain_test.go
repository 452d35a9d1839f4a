package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/kvtier/kvtier/offload"
)

// example is the shipped example config; the tests below double as its
// validity check.
const example = "../../examples/explain.yaml"

// runCLI runs kvtier in-process with args and stdin, capturing the output.
func runCLI(t *testing.T, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(args, strings.NewReader(stdin), &out, &errOut)
	return code, out.String(), errOut.String()
}

// strictMessage is offload's own strict-mode error for params; explain
// must pass it through unchanged (the daemon will return the same text).
func strictMessage(t *testing.T, params string) string {
	t.Helper()
	p := offload.Parser{Mode: offload.Strict}
	_, err := p.NewReqContext("r", params)
	if !errors.Is(err, offload.ErrInvalidFilter) {
		t.Fatalf("strict parse of %s: %v, want an invalid-filter error", params, err)
	}
	return err.Error()
}

// strictError is the --json output for a strict rejection of params.
func strictError(t *testing.T, params string) string {
	b, err := json.Marshal(map[string]string{"error": "request rejected (strict validation): " + strictMessage(t, params)})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

const strictConfig = `
secondary_tiers:
  - {name: ssd, type: memory, medium: storage, locality: local}
  - {name: redis, type: memory, medium: cpu, locality: remote}
default_load_tiers: [{locality: local}]
default_store_tiers: []
validation: strict
`

func TestExplainJSON(t *testing.T) {
	strict := writeFile(t, "strict.yaml", strictConfig)
	paramsFile := writeFile(t, "params.json", `{"kv_load_tiers":[{"medium":"cpu"}]}`)
	cases := []struct {
		name   string
		config string
		params string
		stdin  string
		want   string
		code   int
	}{
		{"storage only", example, `{"kv_load_tiers":[{"medium":"storage"}]}`, "",
			`{"load":["local-ssd","s3","peer"],"store":["local-ssd","s3","redis","peer"],"warnings":[]}`, 0},
		{"primary only", example, `{"kv_load_tiers":[],"kv_store_tiers":[]}`, "",
			`{"load":[],"store":[],"warnings":[]}`, 0},
		{"CPU tiers everywhere", example, `{"kv_load_tiers":[{"medium":"CPU"}],"kv_store_tiers":[{"medium":"cpu"}]}`, "",
			`{"load":["redis","peer"],"store":["redis","peer"],"warnings":[]}`, 0},
		{"everything local", example, `{"kv_load_tiers":[{"locality":"local"}],"kv_store_tiers":[{"locality":"local"}]}`, "",
			`{"load":["local-ssd","peer"],"store":["local-ssd","peer"],"warnings":[]}`, 0},
		{"remote CPU + local storage", example,
			`{"kv_load_tiers":[{"medium":"cpu","locality":"remote"},{"medium":"storage","locality":"local"}]}`, "",
			`{"load":["local-ssd","redis","peer"],"store":["local-ssd","s3","redis","peer"],"warnings":[]}`, 0},
		{"store to storage only", example, `{"kv_store_tiers":[{"medium":"storage"}]}`, "",
			`{"load":["local-ssd","s3","redis","peer"],"store":["local-ssd","s3","peer"],"warnings":[]}`, 0},
		{"no params", example, "", "",
			`{"load":["local-ssd","s3","redis","peer"],"store":["local-ssd","s3","redis","peer"],"warnings":[]}`, 0},
		{"one warning per problem", example,
			`{"kv_load_tiers":[{"medium":"storage"},"x",{"locality":"moon"}],"kv_store_tiers":"cpu"}`, "",
			`{"load":["local-ssd","s3","peer"],"store":["local-ssd","s3","redis","peer"],"warnings":[` +
				`"kv_load_tiers[1]: entry is not an object (got string); skipping",` +
				`"kv_load_tiers[2]: unknown locality \"moon\"; skipping entry",` +
				`"kv_store_tiers: expected list, got string; ignoring"]}`, 0},
		{"all entries invalid fail open", example, `{"kv_load_tiers":[{"medium":"gpu"}]}`, "",
			`{"load":["local-ssd","s3","redis","peer"],"store":["local-ssd","s3","redis","peer"],"warnings":["kv_load_tiers[0]: unknown medium \"gpu\"; skipping entry"]}`, 0},
		{"params from stdin", example, "-", `{"kv_load_tiers":[{"locality":"global"}]}`,
			`{"load":["s3","redis","peer"],"store":["local-ssd","s3","redis","peer"],"warnings":[]}`, 0},
		{"params from a file", example, "@" + paramsFile, "",
			`{"load":["redis","peer"],"store":["local-ssd","s3","redis","peer"],"warnings":[]}`, 0},
		{"server defaults when omitted", strict, `{}`, "",
			`{"load":["ssd"],"store":[],"warnings":[]}`, 0},
		{"request overrides server defaults", strict, `{"kv_load_tiers":[{"medium":"cpu"}],"kv_store_tiers":[{}]}`, "",
			`{"load":["redis"],"store":["ssd","redis"],"warnings":[]}`, 0},
		{"strict rejects an invalid filter", strict, `{"kv_store_tiers":[{"medium":"storage"},{"medium":"tape"}]}`, "",
			strictError(t, `{"kv_store_tiers":[{"medium":"storage"},{"medium":"tape"}]}`), 1},
		{"strict rejects a non-list", strict, `{"kv_load_tiers":"local"}`, "",
			strictError(t, `{"kv_load_tiers":"local"}`), 1},
		{"invalid params JSON", example, `{"kv_load_tiers":`, "",
			`{"error":"--params: invalid kv_transfer_params: unexpected EOF"}`, 1},
		{"params not an object", example, `[1]`, "",
			`{"error":"--params: invalid kv_transfer_params: want a JSON object, got array"}`, 1},
		{"missing params file", example, "@/nonexistent/params.json", "",
			`{"error":"--params: open /nonexistent/params.json: no such file or directory"}`, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runCLI(t, tc.stdin, "explain", "--config", tc.config, "--params", tc.params, "--json")
			if code != tc.code {
				t.Errorf("exit code %d, want %d (stderr %q)", code, tc.code, stderr)
			}
			if stdout != tc.want+"\n" {
				t.Errorf("stdout\n got %s\nwant %s", stdout, tc.want)
			}
			if stderr != "" {
				t.Errorf("stderr %q, want nothing", stderr)
			}
			var obj map[string]any
			if err := json.Unmarshal([]byte(stdout), &obj); err != nil {
				t.Errorf("stdout is not one JSON object: %v", err)
			}
		})
	}
}

func TestExplainText(t *testing.T) {
	strict := writeFile(t, "strict.yaml", strictConfig)
	empty := writeFile(t, "empty.yaml", "secondary_tiers: []  # the built-in defaults: the primary alone\n")
	cases := []struct {
		name   string
		args   []string
		want   []string // lines (trimmed of trailing spaces) that must appear, in order
		code   int
		stderr string
	}{
		{"matchers, dynamic tier and a warning",
			[]string{"--config", example, "--params", `{"kv_load_tiers":[{"medium":"storage"},{"medium":"bogus"}]}`},
			[]string{
				"config ../../examples/explain.yaml: 4 secondary tiers, validation lenient",
				"load filter:   [{medium:STORAGE}]  from the request's kv_load_tiers",
				"store filter:  ALL                 the request omits kv_store_tiers and the server sets no default_store_tiers",
				"local-ssd (memory, STORAGE/LOCAL)",
				"  load   yes  matcher {medium:STORAGE} matches",
				"  store  yes  filter is ALL: every tier",
				"redis (memory, CPU/REMOTE)",
				"  load   no   no matcher matches CPU/REMOTE",
				"peer (memory, dynamic/dynamic)",
				"  load   yes  matcher {medium:STORAGE} matches (the tier is dynamic on medium and applies the filter itself)",
				"loads from: local-ssd, s3, peer",
				"stores to:  local-ssd, s3, redis, peer",
				"(the CPU primary tier always takes part and is not listed)",
				"warnings (1):",
				`  kv_load_tiers[1]: unknown medium "bogus"; skipping entry`,
			}, 0, ""},
		{"deny all and server defaults",
			[]string{"--config", strict, "--params", `{"kv_load_tiers":[]}`},
			[]string{
				"load filter:   []  from the request's kv_load_tiers",
				"store filter:  []  the request omits kv_store_tiers: server default default_store_tiers",
				"ssd (memory, STORAGE/LOCAL)",
				"  load   no  filter is []: no secondary tier",
				"loads from: no secondary tier",
				"warnings: none",
			}, 0, ""},
		{"fail open",
			[]string{"--config", example, "--params", `{"kv_load_tiers":[{"medium":"gpu"}]}`},
			[]string{"load filter:   ALL  the request's kv_load_tiers had no valid entry, so it fell back to ALL (see warnings)"}, 0, ""},
		{"no secondary tiers",
			[]string{"--config", empty},
			[]string{"No secondary tiers are configured: only the CPU primary tier serves requests."}, 0, ""},
		{"strict rejection on stderr",
			[]string{"--config", strict, "--params", `{"kv_load_tiers":[5]}`},
			nil, 1, "kvtier: request rejected (strict validation): " + strictMessage(t, `{"kv_load_tiers":[5]}`) + "\n"},
		{"config is required",
			[]string{"--params", "{}"},
			nil, 1, "kvtier: required flag(s) \"config\" not set\n"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runCLI(t, "", append([]string{"explain"}, tc.args...)...)
			if code != tc.code || stderr != tc.stderr {
				t.Errorf("exit %d stderr %q, want %d %q", code, stderr, tc.code, tc.stderr)
			}
			var lines []string
			for l := range strings.SplitSeq(stdout, "\n") {
				lines = append(lines, strings.TrimRight(l, " "))
			}
			i := 0
			for _, w := range tc.want {
				for i < len(lines) && lines[i] != w {
					i++
				}
				if i == len(lines) {
					t.Fatalf("output lacks line %q (in order):\n%s", w, stdout)
				}
			}
		})
	}
}

// TestExplainConfigErrors checks that config problems stop explain with
// an error naming the file, line and key, in text and JSON mode. want is
// the start of the message after the file name.
func TestExplainConfigErrors(t *testing.T) {
	cases := []struct {
		name string
		doc  string
		want string
	}{
		{"unknown key", "secondary_tiers: []\ncache_size: 1GiB\n",
			`:2: cache_size: unknown key (want one of: namespace, primary, `}, // the full list is config's to test
		{"bad medium value", "secondary_tiers:\n  - name: ssd\n    type: memory\n    medium: Floppy\n",
			`:4: secondary_tiers[0].medium: invalid value "Floppy" (want cpu or storage)`},
		{"bad locality value", "secondary_tiers:\n  - {type: memory}\n  - {type: memory, locality: moon}\n",
			`:3: secondary_tiers[1].locality: invalid value "moon" (want local or remote)`},
		{"duplicate name", "secondary_tiers:\n  - {name: a, type: memory}\n  - {name: a, type: memory}\n",
			`:3: secondary_tiers[1].name: duplicate name "a" (also secondary_tiers[0])`},
		{"bad default filter", "default_load_tiers:\n  - medium: storage\n  - medium: moon\n",
			`:3: default_load_tiers[1].medium: invalid value "moon" (want cpu or storage)`},
		{"default filter not a list", "default_store_tiers: {medium: storage}\n",
			`:1: default_store_tiers: want a list of matchers such as [{medium: storage}], got a mapping`},
		{"unknown type", "secondary_tiers:\n  - name: disk\n    type: floppy\n",
			`:2: secondary_tiers[0].type: unknown tier type "floppy" (supported: fs, memory, peer, redis, s3)`},
		{"unknown memory key", "secondary_tiers:\n  - type: memory\n    size: 1GiB\n",
			`:3: secondary_tiers[0].size: unknown key (want one of: name, type, medium, locality, capacity_blocks, latency, block_latency, concurrency, queue_depth, fail_rate, async_lookup, events, seed)`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := writeFile(t, "kvtier.yaml", tc.doc)
			code, stdout, stderr := runCLI(t, "", "explain", "--config", path, "--params", "{}")
			if want := "kvtier: " + path + tc.want; code != 1 || stdout != "" || !strings.HasPrefix(stderr, want) || strings.Count(stderr, "\n") != 1 {
				t.Errorf("exit %d, stdout %q, stderr\n got %q\nwant %q", code, stdout, stderr, want)
			}
			code, stdout, stderr = runCLI(t, "", "explain", "--config", path, "--params", "{}", "--json")
			var got struct{ Error string }
			if err := json.Unmarshal([]byte(stdout), &got); err != nil || code != 1 || stderr != "" || !strings.HasPrefix(got.Error, path+tc.want) {
				t.Errorf("--json: exit %d, stdout %q, stderr %q (%v)", code, stdout, stderr, err)
			}
		})
	}
}

func TestVersion(t *testing.T) {
	code, stdout, stderr := runCLI(t, "", "version")
	if code != 0 || stderr != "" {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	lines := strings.Split(stdout, "\n")
	if lines[0] != "kvtier dev" || !strings.HasPrefix(lines[1], runtime.Version()+" ") {
		t.Errorf("version output:\n%s", stdout)
	}
	if code, _, stderr := runCLI(t, "", "version", "extra"); code != 1 || !strings.Contains(stderr, "unknown command") {
		t.Errorf("version with an argument: exit %d, stderr %q", code, stderr)
	}
}
