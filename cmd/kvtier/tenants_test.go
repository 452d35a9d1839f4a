package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvtier/kvtier/config"
	"github.com/kvtier/kvtier/offload"
)

// TestTenantsAgainstADaemon: a daemon built from a config with tenants
// (one token from a file) keeps their blocks apart, and `kvtier stats`
// shows each its own row.
func TestTenantsAgainstADaemon(t *testing.T) {
	dir := shortTempDir(t)
	tcp := freeTCP(t)
	if err := os.WriteFile(filepath.Join(dir, "beta.token"), []byte("beta-secret-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	doc := fmt.Sprintf(`
namespace: {model: m, bytes_per_block: 4KiB}
primary: {bytes: 64KiB}
secondary_tiers:
  - {name: disk, type: fs, root_dir: %s/data, max_bytes: 1MiB}
server: {unix_socket: %s/k.sock, tcp_addr: %q, metrics_addr: "", auth_token: admin-secret-0123456789}
tenants:
  - {name: acme, token: acme-secret-0123456789, namespaces: [default], quota: {primary: 16KiB, tiers: {disk: 256KiB}}, weight: 2}
  - {name: beta, token_file: %s/beta.token, namespaces: [default], quota: {primary: 16KiB, tiers: {disk: 256KiB}}}
shared_spaces:
  - {name: prompts, tenants: [acme, beta], quota: {primary: 8KiB}}
`, dir, dir, tcp, dir)
	cfg, err := config.Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := buildDaemon(context.Background(), cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	d := &opsDaemon{srv: srv}
	t.Cleanup(d.stop)
	key := offload.MakeKey([]byte{1, 2, 3, 4, 5, 6, 7, 8}, 0).String()
	path, _ := blockFile(t, dir, 1, 4096)
	as := func(token string, args ...string) (int, string, string) {
		return runCLI(t, "", append([]string{args[0], "--target", tcp, "--token", token}, args[1:]...)...)
	}
	if code, out, errOut := as("acme-secret-0123456789", "put", key, path); code != 0 || out != key+" stored\n" {
		t.Fatalf("acme put: exit %d %q %q", code, out, errOut)
	}
	if code, _, errOut := as("beta-secret-0123456789", "get", key); code != exitMiss {
		t.Fatalf("beta get of acme's key: exit %d %q; want a miss", code, errOut)
	}
	if code, _, errOut := as("acme-secret-0123456789", "get", key); code != 0 {
		t.Fatalf("acme get: exit %d %q", code, errOut)
	}
	code, out, errOut := as("admin-secret-0123456789", "stats", "--tenant", "acme")
	if code != 0 || !strings.Contains(out, "acme    tenant  4.0KiB   16.0KiB") || !strings.Contains(out, "/256.0KiB") {
		t.Fatalf("stats --tenant acme: exit %d %q\n%s", code, errOut, out)
	}
	code, out, _ = as("admin-secret-0123456789", "stats")
	for _, want := range []string{"primary   16 slots", "TENANT", "acme", "beta", "prompts  shared"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("admin stats lacks %q:\n%s", want, out)
		}
	}
	code, out, _ = as("beta-secret-0123456789", "stats")
	if code != 0 || strings.Contains(out, "acme") || strings.Contains(out, "primary") || !strings.Contains(out, "beta") {
		t.Errorf("beta's stats shows more than beta:\n%s", out)
	}
	if code, _, errOut := as("beta-secret-0123456789", "stats", "--tenant", "acme"); code == 0 || !strings.Contains(errOut, "no tenant") {
		t.Errorf("beta's stats --tenant acme: exit %d %q", code, errOut)
	}
}

// TestTenantConfigErrors: every mistake in tenants is a config error
// naming its key.
func TestTenantConfigErrors(t *testing.T) {
	for _, tc := range []struct{ doc, want string }{
		{`tenants: [{name: a, token: x, namespaces: [default], quota: {primary: 2GiB}}]`, "quotas add up to 2GiB, more than primary.bytes = 1GiB"},
		{`tenants: [{name: a, token: x, namespaces: [default], quota: {primary: 600MiB}}, {name: b, token: y, namespaces: [default], quota: {primary: 600MiB}}]`, "quotas add up to 1200MiB"},
		{`tenants: [{name: a, namespaces: [default]}]`, "tenants[0].token: required"},
		{`tenants: [{name: a, token: short, namespaces: [default]}]`, "tenants[0].token: a token of 5 bytes: at least 16"},
		{`server: {auth_token: short}`, "server.auth_token: a token of 5 bytes: at least 16"},
		{`tenants: [{name: a, token: x, token_file: /f, namespaces: [default]}]`, "set one of token, token_file and token_env"},
		{`tenants: [{name: a, token_env: X, token_file: /f, namespaces: [default]}]`, "set one of token, token_file and token_env"},
		{`server: {auth_token_env: X, auth_token: a-token-of-sixteen-bytes}`, "set one of server.auth_token, server.auth_token_file and server.auth_token_env"},
		{`tenants: [{name: a, token: x}]`, "tenants[0].namespaces: required"},
		{`tenants: [{name: a, token: x, namespaces: [default]}, {name: a, token: y, namespaces: [default]}]`, `duplicate name "a"`},
		{`tenants: [{name: a, token: x, namespaces: [default]}, {name: b, token: x, namespaces: [default]}]`, "the same token as tenants[0]"},
		{`{server: {auth_token: x}, tenants: [{name: a, token: x, namespaces: [default]}]}`, "the same token as server.auth_token"},
		{`tenants: [{name: "a b", token: x, namespaces: [default]}]`, "invalid name"},
		{`tenants: [{name: a, token: x, namespaces: [default], weight: -2}]`, "tenants[0].weight: must be positive"},
		{`tenants: [{name: a, token: x, namespaces: [default], quota: {primary: -1}}]`, "quota.primary"},
		{`tenants: [{name: a, token: x, namespaces: [default], quota: {primery: 1GiB}}]`, "primery"},
		{`{tenants: [{name: a, token: x, namespaces: [default]}], shared_spaces: [{name: p, tenants: [a, z]}]}`, `no tenant is called "z"`},
		{`{tenants: [{name: a, token: x, namespaces: [default]}], shared_spaces: [{name: default, tenants: [a]}]}`, "the daemon's namespace"},
		{`tenants: [{name: a, token: x, namespaces: [default], event_salt: s}, {name: b, token: y, namespaces: [default], event_salt: s}]`, `tenants[1].event_salt: the same salt as tenants[0]`},
		{`tenants: [{name: a, token: x, namespaces: [default]}, {name: b, token: y, namespaces: [default], event_salt: "kvtier_tenant:a"}]`, `tenants[1].event_salt: the same salt as tenants[0]`},
		{`tenants: [{name: a, token: x, namespaces: [default], event_salt: "` + strings.Repeat("s", 257) + `"}]`, `tenants[0].event_salt: 257 bytes, at most 256`},
		{`{primary: {bytes: 0}, tenants: [{name: a, token: x, namespaces: [default], quota: {primary: 1MiB}}]}`, "need the daemon's primary"},
		{`tenants: [{name: a, token: x, namespaces: [default], quota: {tiers: {disk: 1GiB}}}]`, `tenants[0].quota.tiers.disk: no secondary tier is called "disk"`},
		{`{secondary_tiers: [{name: p, type: peer, peers: [{name: x, addr: "127.0.0.1:1"}]}], tenants: [{name: a, token: x, namespaces: [default], quota: {tiers: {p: 1GiB}}}]}`, "a peer's DRAM is its own daemon's to divide"},
		{`{secondary_tiers: [{name: r, type: redis, addr: "127.0.0.1:1"}], tenants: [{name: a, token: x, namespaces: [default], quota: {tiers: {r: 1GiB}}}]}`, "secondary_tiers[0].max_bytes: required by the tenants' quotas"},
		{`{secondary_tiers: [{name: o, type: s3, bucket: b, max_bytes: 1GiB}], tenants: [{name: a, token: x, namespaces: [default], quota: {tiers: {o: 2GiB}}}]}`, `the quotas of tier "o" add up to 2GiB, more than its max_bytes = 1GiB`},
		{`{secondary_tiers: [{name: d, type: fs, root_dir: /tmp/x}], tenants: [{name: a, token: x, namespaces: [default], quota: {tiers: {d: 1GiB}}}]}`, "secondary_tiers[0].max_bytes: required by the tenants' quotas"},
		{`{secondary_tiers: [{name: d, type: fs, root_dir: /tmp/x, max_bytes: 1GiB}], tenants: [{name: a, token: x, namespaces: [default], quota: {tiers: {d: 600MiB}}}, {name: b, token: y, namespaces: [default], quota: {tiers: {d: 600MiB}}}]}`, `the quotas of tier "d" add up to 1200MiB, more than its max_bytes = 1GiB`},
		{`{secondary_tiers: [{name: m, type: memory}], tenants: [{name: a, token: x, namespaces: [default], quota: {tiers: {m: 1GiB}}}]}`, "secondary_tiers[0].capacity_blocks: required by the tenants' quotas"},
		{`{secondary_tiers: [{name: m, type: memory, capacity_blocks: 4}], tenants: [{name: a, token: x, namespaces: [default], quota: {tiers: {m: 10MiB}}}]}`, `the quotas of tier "m" add up to 10MiB, more than its capacity_blocks = 4 × bytes_per_block 2MiB = 8MiB`},
	} {
		_, err := config.Parse([]byte(tc.doc))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s\n  got %v\n  want an error containing %q", tc.doc, err, tc.want)
		}
	}
	// A token file that cannot be read is an error at start.
	cfg, err := config.Parse([]byte(`tenants: [{name: a, token_file: /nonexistent/t, namespaces: [default]}]`))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := tenantsOf(cfg); err == nil || !strings.Contains(err.Error(), "tenants[0].token_file") {
		t.Errorf("unreadable token file: %v", err)
	}
	// A token from the environment, and its errors.
	t.Setenv("KVTIER_TEST_ACME", "a-token-of-sixteen-bytes")
	t.Setenv("KVTIER_TEST_SHORT", "short")
	for env, want := range map[string]string{"KVTIER_TEST_ACME": "", "KVTIER_TEST_SHORT": "a token of 5 bytes", "KVTIER_TEST_UNSET": "$KVTIER_TEST_UNSET is unset or empty"} {
		cfg, err := config.Parse([]byte(`tenants: [{name: a, token_env: ` + env + `, namespaces: [default]}]`))
		if err != nil {
			t.Fatal(err)
		}
		ts, _, err := tenantsOf(cfg)
		switch {
		case want == "" && (err != nil || ts[0].Token != "a-token-of-sixteen-bytes"):
			t.Errorf("token_env %s: %v %v", env, ts, err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
			t.Errorf("token_env %s: %v, want %q", env, err, want)
		}
	}
	// So is one others may read, and one holding a short token.
	for _, tc := range []struct {
		tok  string
		perm os.FileMode
		want string
	}{
		{"a-token-of-sixteen-bytes", 0o640, "lets its group or others read the token"},
		{"short", 0o600, "a token of 5 bytes: at least 16"},
		{"a-token-of-sixteen-bytes", 0o400, ""},
	} {
		cfg, err := config.Parse([]byte(`tenants: [{name: a, token_file: ` + tokenFile(t, tc.tok, tc.perm) + `, namespaces: [default]}]`))
		if err != nil {
			t.Fatal(err)
		}
		_, _, err = tenantsOf(cfg)
		if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("token file %q of mode %04o: %v, want %q", tc.tok, tc.perm, err, tc.want)
		}
	}
}
