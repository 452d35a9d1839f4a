package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/config"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/server"
)

// The operator commands against a daemon built as `kvtier serve` builds it
// (buildDaemon: a file-backed fs tier, the gRPC API on a Unix socket and
// on TCP with an auth token; this user's token-less calls on the Unix
// socket are the admin's through server.unix_peers).

type opsDaemon struct {
	dir, config, unix, tcp string
	srv                    *server.Server
	c                      *client.Client
}

const opsToken = "s3cret-of-16-bytes-or-more"

func startOpsDaemon(t *testing.T) *opsDaemon {
	t.Helper()
	dir, err := os.MkdirTemp("", "kvt") // short: Unix socket paths are limited
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	tcp := freeTCP(t)
	doc := fmt.Sprintf(`
namespace: {model: m, bytes_per_block: 4KiB}
primary: {bytes: 64KiB}
secondary_tiers:
  - {name: local-disk, type: fs, root_dir: %s/data}
server: {unix_socket: %s/k.sock, tcp_addr: %q, metrics_addr: "", auth_token: %s, unix_peers: [{uid: %d, as: admin}]}
`, dir, dir, tcp, opsToken, os.Getuid())
	d := &opsDaemon{dir: dir, config: filepath.Join(dir, "kvtier.yaml"), unix: dir + "/k.sock", tcp: tcp}
	if err := os.WriteFile(d.config, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	d.srv, err = buildDaemon(context.Background(), cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if err := d.srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.stop() })
	d.c, err = client.Dial(d.unix, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.c.Close() })
	return d
}

func (d *opsDaemon) stop() {
	if d.srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		d.srv.Shutdown(ctx)
		d.srv = nil
	}
}

func freeTCP(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// blockFile writes a 4 KiB block derived from seed and returns its path
// and bytes.
func blockFile(t *testing.T, dir string, seed byte, size int) (string, []byte) {
	t.Helper()
	b := bytes.Repeat([]byte{seed, seed ^ 0x5a, 7, 1}, size/4+1)[:size]
	p := filepath.Join(dir, fmt.Sprintf("block-%d-%d", seed, size))
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p, b
}

func TestPutGetLookupAgainstADaemon(t *testing.T) {
	d := startOpsDaemon(t)
	sock := "--target=" + d.unix
	key := offload.MakeKey([]byte{1, 2, 3, 4, 5, 6, 7, 8}, 0).String()
	path, data := blockFile(t, d.dir, 1, 4096)

	code, out, errOut := runCLI(t, "", "put", sock, key, path)
	if code != 0 || out != key+" stored\n" {
		t.Fatalf("put: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if code, out, _ := runCLI(t, "", "put", sock, key, path); code != 0 || out != key+" already present\n" {
		t.Fatalf("put again: exit %d, stdout %q", code, out)
	}
	got := filepath.Join(d.dir, "got")
	if code, _, errOut := runCLI(t, "", "get", sock, "-o", got, key); code != 0 {
		t.Fatalf("get: exit %d, stderr %q", code, errOut)
	}
	if b, _ := os.ReadFile(got); !bytes.Equal(b, data) {
		t.Fatal("get -o wrote other bytes than put stored")
	}
	if code, out, _ := runCLI(t, "", "get", sock, key); code != 0 || out != string(data) {
		t.Fatalf("get to stdout: exit %d, %d bytes", code, len(out))
	}
	other := offload.MakeKey([]byte{9, 9, 9, 9, 9, 9, 9, 9}, 0).String()
	if code, out, errOut := runCLI(t, "", "get", sock, other); code != exitMiss || errOut != "miss\n" || out != "" {
		t.Fatalf("get of an absent block: exit %d, stdout %q, stderr %q; want exit 3 and miss", code, out, errOut)
	}
	hashForm := offload.Key(mustHex(t, key)).HexHash() + "/g0"
	code, out, _ = runCLI(t, "", "lookup", sock, key, other, hashForm)
	if want := key + " hit primary\n" + other + " miss\n" + hashForm + " hit primary\n"; code != 0 || out != want {
		t.Fatalf("lookup: exit %d\n%s\nwant\n%s", code, out, want)
	}
	code, out, _ = runCLI(t, "", "lookup", sock, "--json", key)
	var lines []lookupLine
	if err := json.Unmarshal([]byte(out), &lines); code != 0 || err != nil || len(lines) != 1 || lines[0] != (lookupLine{key, "hit", "primary"}) {
		t.Fatalf("lookup --json: exit %d, %v, %q", code, err, out)
	}

	// The block reaches the fs tier; after a Reset of the primary it is
	// promoted from there.
	waitFor(t, func() bool {
		st, err := d.c.Stats(ctxFor(t))
		return err == nil && st.GetTiers()[0].GetCascadesOk() >= 1
	})
	if err := d.c.Reset(ctxFor(t)); err != nil {
		t.Fatal(err)
	}
	code, out, _ = runCLI(t, "", "lookup", sock, "--params", `{"kv_load_tiers":[]}`, key)
	if code != 0 || out != key+" miss\n" {
		t.Fatalf("lookup with no secondary tier allowed: exit %d, %q", code, out)
	}
	code, out, _ = runCLI(t, "", "lookup", sock, key)
	if code != 0 || out != key+" pending local-disk\n" {
		t.Fatalf("lookup after a Reset: exit %d, %q; want pending from local-disk", code, out)
	}
	if code, out, errOut := runCLI(t, "", "get", sock, "--wait=5s", key); code != 0 || out != string(data) {
		t.Fatalf("get promoted from disk: exit %d, %d bytes, stderr %q", code, len(out), errOut)
	}
}

func TestOperatorCommandErrors(t *testing.T) {
	d := startOpsDaemon(t)
	key := offload.MakeKey([]byte{1, 2, 3, 4, 5, 6, 7, 8}, 3).String()
	small, _ := blockFile(t, d.dir, 2, 100)
	good, _ := blockFile(t, d.dir, 3, 4096)
	for _, tc := range []struct {
		name  string
		env   string
		args  []string
		code  int
		want  string
		inOut bool // want in stdout instead of stderr
	}{
		{"wrong block size", "", []string{"put", "--target", d.unix, key, small}, 1, "is 100 bytes; the daemon's blocks are 4096 bytes", false},
		{"bad key", "", []string{"get", "--target", d.unix, "xyz"}, 1, `key "xyz" is not hex`, false},
		{"short key", "", []string{"lookup", "--target", d.unix, "0102"}, 1, `key "0102" is 2 bytes`, false},
		{"bad params", "", []string{"get", "--target", d.unix, "--params", "{nope", key}, 1, "--params: not a JSON object", false},
		{"unreachable", "", []string{"stats", "--target", filepath.Join(d.dir, "none.sock")}, 1, "cannot reach a kvtier daemon at", false},
		{"unreachable tcp", "", []string{"stats", "--target", freeTCP(t)}, 1, "cannot reach a kvtier daemon at", false},
		{"missing token", "", []string{"stats", "--target", d.tcp}, 1, "wants an auth token (--token-file, --token", false},
		{"wrong token", "", []string{"put", "--target", d.tcp, "--token", "nope", key, good}, 1, "wants an auth token", false},
		{"token flag", "", []string{"put", "--target", d.tcp, "--token", opsToken, key, good}, 0, "stored", true},
		{"token env", opsToken, []string{"lookup", "--target", d.tcp, key}, 0, key + " hit primary", true},
		{"token file", "", []string{"lookup", "--target", d.tcp, "--token-file", tokenFile(t, opsToken, 0o600), key}, 0, key + " hit primary", true},
		{"token file others may read", "", []string{"lookup", "--target", d.tcp, "--token-file", tokenFile(t, opsToken, 0o644), key}, 1, "lets its group or others read the token", false},
		{"token and token file", "", []string{"lookup", "--target", d.tcp, "--token", opsToken, "--token-file", tokenFile(t, opsToken, 0o600), key}, 1, "give one", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("KVTIER_TOKEN", tc.env)
			code, out, errOut := runCLI(t, "", tc.args...)
			where := errOut
			if tc.inOut {
				where = out
			}
			if code != tc.code || !strings.Contains(where, tc.want) {
				t.Fatalf("exit %d, stdout %q, stderr %q; want exit %d with %q", code, out, errOut, tc.code, tc.want)
			}
		})
	}
}

func TestStatsAgainstADaemon(t *testing.T) {
	d := startOpsDaemon(t)
	key := offload.MakeKey([]byte{1, 2, 3, 4, 5, 6, 7, 8}, 0).String()
	path, _ := blockFile(t, d.dir, 1, 4096)
	if code, _, errOut := runCLI(t, "", "put", "--target", d.unix, key, path); code != 0 {
		t.Fatal(errOut)
	}
	waitFor(t, func() bool {
		st, err := d.c.Stats(ctxFor(t))
		return err == nil && st.GetTiers()[0].GetCascadesOk() == 1 && st.GetCascadePinnedSlots() == 0
	})
	code, out, errOut := runCLI(t, "", "stats", "--target", d.unix)
	if code != 0 {
		t.Fatalf("stats: exit %d: %s", code, errOut)
	}
	for _, want := range []string{"primary   16 slots of 4.0KiB: 1 used", "local-disk  fs", "STORAGE  LOCAL", "yes", "1/0/0/0"} {
		if !strings.Contains(out, want) {
			t.Errorf("stats output lacks %q:\n%s", want, out)
		}
	}
	code, out, _ = runCLI(t, "", "stats", "--target", d.unix, "--json")
	var st struct {
		Primary struct {
			UsedSlots json.Number `json:"used_slots"`
		} `json:"primary"`
		Tiers []struct {
			Name    string      `json:"name"`
			Healthy bool        `json:"healthy"`
			Blocks  json.Number `json:"blocks"`
			Bytes   json.Number `json:"bytes"`
		} `json:"tiers"`
	}
	if err := json.Unmarshal([]byte(out), &st); code != 0 || err != nil {
		t.Fatalf("stats --json: exit %d, %v\n%s", code, err, out)
	}
	if st.Primary.UsedSlots != "1" || len(st.Tiers) != 1 || st.Tiers[0].Name != "local-disk" || !st.Tiers[0].Healthy || st.Tiers[0].Blocks != "1" || st.Tiers[0].Bytes != "4120" {
		t.Fatalf("stats --json: %+v", st)
	}
}

func TestFsckAgainstADaemonsDirectory(t *testing.T) {
	d := startOpsDaemon(t)
	for i := range 3 {
		path, _ := blockFile(t, d.dir, byte(i), 4096)
		key := offload.MakeKey([]byte{1, 2, 3, 4, 5, 6, 7, byte(i)}, 0).String()
		if code, _, errOut := runCLI(t, "", "put", "--target", d.unix, key, path); code != 0 {
			t.Fatal(errOut)
		}
	}
	waitFor(t, func() bool {
		st, err := d.c.Stats(ctxFor(t))
		return err == nil && st.GetTiers()[0].GetCascadesOk() == 3
	})
	code, out, _ := runCLI(t, "", "fsck", "--config", d.config)
	if code != 1 || !strings.Contains(out, "local-disk: skipped") || !strings.Contains(out, "in use by another kvtier process") {
		t.Fatalf("fsck beside the daemon: exit %d, %q", code, out)
	}
	d.stop()
	if code, out, _ := runCLI(t, "", "fsck", "--config", d.config); code != 0 || !strings.Contains(out, "3 files, 3 good blocks") {
		t.Fatalf("fsck of a clean tier: exit %d, %q", code, out)
	}
	// Damage one block file.
	var files []string
	filepath.WalkDir(filepath.Join(d.dir, "data"), func(p string, de os.DirEntry, err error) error {
		if err == nil && strings.HasSuffix(p, ".bin") {
			files = append(files, p)
		}
		return nil
	})
	if len(files) != 3 {
		t.Fatalf("%d block files", len(files))
	}
	if err := os.WriteFile(files[1], []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, _ = runCLI(t, "", "fsck", "--config", d.config, "--tier", "local-disk")
	if code != 1 || !strings.Contains(out, "corrupt\t"+files[1]) || !strings.Contains(out, "1 corrupt, 0 stray") || !strings.Contains(out, "--repair") {
		t.Fatalf("fsck of a damaged tier: exit %d, %q", code, out)
	}
	code, out, _ = runCLI(t, "", "fsck", "--config", d.config, "--repair")
	if _, err := os.Stat(files[1]); code != 0 || !os.IsNotExist(err) || !strings.Contains(out, "(removed)") {
		t.Fatalf("fsck --repair: exit %d, %q; file: %v", code, out, err)
	}
	if code, _, errOut := runCLI(t, "", "fsck", "--config", d.config, "--tier", "nope"); code != 1 || !strings.Contains(errOut, `--tier "nope"`) || !strings.Contains(errOut, "local-disk") {
		t.Fatalf("fsck --tier nope: exit %d, %q", code, errOut)
	}
}

func mustHex(t *testing.T, s string) string {
	t.Helper()
	k, err := offload.ParseKey(s)
	if err != nil {
		t.Fatal(err)
	}
	return string(k)
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// waitFor polls cond: the daemon's tiers work on their own goroutines.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition never held")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// tokenFile writes tok to a new file of mode perm and returns its path.
func tokenFile(t *testing.T, tok string, perm os.FileMode) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(path, []byte(tok+"\n"), perm); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, perm); err != nil { // past the umask
		t.Fatal(err)
	}
	return path
}
