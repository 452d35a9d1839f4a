package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/config"
	"github.com/kvtier/kvtier/events/zmtp"
	"github.com/kvtier/kvtier/offload"
)

// TestServeAddressErrorsNameTheKey: an unusable listen address is a
// start-up error that names its config key, found before any tier is
// built.
func TestServeAddressErrorsNameTheKey(t *testing.T) {
	for _, tc := range []struct{ server, want string }{
		{`tcp_addr: nonsense`, `server.tcp_addr: invalid value "nonsense"`},
		{`tcp_addr: "127.0.0.1:99999"`, `server.tcp_addr: invalid value "127.0.0.1:99999"`},
		{`metrics_addr: "localhost"`, `server.metrics_addr: invalid value "localhost"`},
	} {
		t.Run(tc.server, func(t *testing.T) {
			dir := t.TempDir()
			cfg := writeFile(t, "kvtier.yaml", fmt.Sprintf(`
namespace: {bytes_per_block: 4KiB}
primary: {bytes: 64KiB, arena: {kind: anonymous}}
secondary_tiers: [{name: d, type: fs, root_dir: %s}]
server:
  unix_socket: ""
  %s
`, filepath.Join(dir, "data"), tc.server))
			code, _, stderr := runCLI(t, "", "serve", "--config", cfg)
			if code != 1 || !strings.Contains(stderr, tc.want) {
				t.Fatalf("exit %d, stderr %q; want exit 1 naming %q", code, stderr, tc.want)
			}
		})
	}
}

// TestServeEventsConfig: events.mode and events.medium_names reach the
// publisher. The endpoint is a plain TCP address, which vLLM's rule would
// connect to, so the subscriber can dial it only because mode: bind was
// applied; the stored block's event names its medium as configured.
func TestServeEventsConfig(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	endpoint := "tcp://" + l.Addr().String()
	l.Close()
	dir, err := os.MkdirTemp("", "kvt") // short: Unix socket paths are limited
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	cfg, err := config.Parse(fmt.Appendf(nil, `
namespace: {bytes_per_block: 4KiB}
primary: {bytes: 64KiB}
server: {unix_socket: %s/k.sock, tcp_addr: "", metrics_addr: ""}
events:
  enabled: true
  endpoint: %s
  mode: bind
  medium_names: {CPU: DRAM}
`, dir, endpoint))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	srv, err := buildDaemon(ctx, cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(context.Background())

	sub, err := zmtp.Dial(ctx, endpoint, zmtp.Sub, nil)
	if err != nil {
		t.Fatalf("dial the publisher (not bound?): %v", err)
	}
	defer sub.Close()
	if err := sub.Subscribe(nil); err != nil {
		t.Fatal(err)
	}
	c, err := client.Dial(dir+"/k.sock", client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.NewRequest(ctx, "r", ""); err != nil {
		t.Fatal(err)
	}
	// The subscription travels asynchronously: store blocks until one
	// batch arrives.
	got := make(chan [][]byte, 1)
	go func() {
		if frames, err := sub.Recv(); err == nil {
			got <- frames
		}
	}()
	var frames [][]byte
	for i := 0; frames == nil; i++ {
		k := offload.MakeKey([]byte{0, 0, 0, 0, 0, 0, 0, byte(i)}, 0)
		res, err := c.PrepareStore(ctx, "r", []offload.Key{k}, nil)
		if err != nil || !res.OK {
			t.Fatalf("prepare store: %v %v", res, err)
		}
		if err := c.CompleteStore(ctx, "r", res.Keys, true); err != nil {
			t.Fatal(err)
		}
		if _, err := c.ScheduleEnd(ctx, nil, nil); err != nil {
			t.Fatal(err)
		}
		select {
		case frames = <-got:
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
			t.Fatal("no event batch arrived")
		}
	}
	var batch []any
	if len(frames) != 3 {
		t.Fatalf("want [topic, seq, payload], got %d frames", len(frames))
	}
	if err := msgpack.Unmarshal(frames[2], &batch); err != nil {
		t.Fatal(err)
	}
	evs, _ := batch[1].([]any)
	if len(evs) == 0 {
		t.Fatalf("batch %v", batch)
	}
	if ev, _ := evs[0].(map[string]any); ev["type"] != "BlockStored" || ev["medium"] != "DRAM" {
		t.Fatalf("event %v, want a BlockStored on medium DRAM", ev)
	}
}

// busyPort holds a loopback port open for the test.
func busyPort(t *testing.T) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// shortTempDir is a temporary directory with a short path (t.TempDir's
// are too long for Unix socket paths), removed after the test.
func shortTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "kvt")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// Issue 11, finding 9: a port in use, a bad events.endpoint and an
// over-long socket path gave errors that did not name the key.
func TestServeStartErrorsNameTheKey(t *testing.T) {
	busy, dir := busyPort(t), shortTempDir(t)
	long := filepath.Join(dir, strings.Repeat("s", 110)+".sock")
	for _, tc := range []struct{ extra, want string }{
		{fmt.Sprintf(`server: {unix_socket: %s/a.sock, tcp_addr: %q, metrics_addr: ""}`, dir, busy.Addr()), "server.tcp_addr " + busy.Addr().String()},
		{fmt.Sprintf(`server: {unix_socket: %s/b.sock, tcp_addr: "", metrics_addr: %q}`, dir, busy.Addr()), "server.metrics_addr " + busy.Addr().String()},
		{fmt.Sprintf(`server: {unix_socket: %q, tcp_addr: "", metrics_addr: ""}`, long), "server.unix_socket"},
		{fmt.Sprintf("server: {unix_socket: %s/c.sock, tcp_addr: \"\", metrics_addr: \"\"}\nevents: {enabled: true, endpoint: \"tcp://%s\", mode: bind}", dir, busy.Addr()), "events.endpoint"},
		{fmt.Sprintf("server: {unix_socket: %s/d.sock, tcp_addr: \"\", metrics_addr: \"\"}\nevents: {enabled: true, endpoint: \"tcp://127.0.0.1:0\", mode: bind, replay_endpoint: \"tcp://%s\"}", dir, busy.Addr()), "events.replay_endpoint"},
	} {
		t.Run(tc.want, func(t *testing.T) {
			cfg := writeFile(t, "kvtier.yaml", fmt.Sprintf("namespace: {bytes_per_block: 4KiB}\nprimary: {bytes: 64KiB, arena: {kind: anonymous}}\n%s\n", tc.extra))
			code, _, stderr := runCLI(t, "", "serve", "--config", cfg)
			if code != 1 || !strings.Contains(stderr, tc.want) {
				t.Fatalf("exit %d, stderr %q; want exit 1 naming %q", code, stderr, tc.want)
			}
		})
	}
}

// A start that fails leaves nothing behind: a busy events endpoint is
// found before the fs tier creates its directory, and the socket's lock
// file goes with the failed start.
func TestFailedStartLeavesNothingBehind(t *testing.T) {
	busy, dir := busyPort(t), shortTempDir(t)
	data := filepath.Join(dir, "data")
	cfg := writeFile(t, "kvtier.yaml", fmt.Sprintf(`
namespace: {bytes_per_block: 4KiB}
primary: {bytes: 64KiB, arena: {kind: anonymous}}
secondary_tiers: [{name: d, type: fs, root_dir: %s}]
server: {unix_socket: %s/k.sock, tcp_addr: "", metrics_addr: ""}
events: {enabled: true, endpoint: "tcp://%s", mode: bind}
`, data, dir, busy.Addr()))
	code, _, stderr := runCLI(t, "", "serve", "--config", cfg)
	if code != 1 || !strings.Contains(stderr, "events") {
		t.Fatalf("exit %d, stderr %q; want a start error naming events", code, stderr)
	}
	if _, err := os.Stat(data); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the fs tier's directory exists after the failed start (%v)", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "k.sock.lock")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the socket's lock file is left behind (%v)", err)
	}
}

// cascades.pin_budget and cascades.tier_share reach the manager: the
// daemon's stats report the budget they make.
func TestCascadeBudgetFromConfig(t *testing.T) {
	for _, tc := range []struct {
		cascades string
		want     int64
	}{
		{"", 16}, // 64 slots x the default 0.25
		{"cascades: {pin_budget: 0.5}", 32},
		{`cascades: {pin_budget: "off"}`, 0},
	} {
		d := newPeerDaemon(t, "budget")
		d.events = tc.cascades
		d.start(t, "[{name: dram, type: memory, medium: cpu, locality: local}]")
		st, err := d.c.Stats(ctxFor(t))
		if err != nil {
			t.Fatal(err)
		}
		if got := st.GetCascadePinBudget(); got != tc.want {
			t.Errorf("%q: cascade pin budget %d, want %d", tc.cascades, got, tc.want)
		}
		d.stop()
	}
}

// serve --check-config: every example config and the embedded default are
// valid (exit 0); a broken one is exit 2 naming its key; nothing is
// created (the fs tier's directory, the socket).
func TestServeCheckConfig(t *testing.T) {
	examples, err := filepath.Glob("../../examples/*.yaml")
	if err != nil || len(examples) == 0 {
		t.Fatalf("examples: %v %v", examples, err)
	}
	for _, ex := range append(examples, "") {
		args := []string{"serve", "--check-config"}
		if ex != "" {
			args = append(args, "--config", ex)
		}
		code, stdout, stderr := runCLI(t, "", args...)
		if code != 0 || !strings.Contains(stdout, "valid") {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want 0", args, code, stdout, stderr)
		}
	}
	dir := t.TempDir()
	for _, tc := range []struct{ yaml, key string }{
		{"cascades: {pin_budget: 2}", "cascades.pin_budget"},
		{fmt.Sprintf("secondary_tiers: [{name: d, type: fs, root_dir: %s, max_bytes: lots}]", filepath.Join(dir, "data")), "secondary_tiers[0].max_bytes"},
		{"server: {tcp_addr: nonsense}", "server.tcp_addr"},
		{fmt.Sprintf("server: {unix_socket: %s/%s.sock}", dir, strings.Repeat("s", 120)), "server.unix_socket"},
	} {
		cfg := writeFile(t, "bad.yaml", "primary: {bytes: 64MiB}\n"+tc.yaml+"\n")
		code, _, stderr := runCLI(t, "", "serve", "--check-config", "--config", cfg)
		if code != 2 || !strings.Contains(stderr, tc.key) {
			t.Errorf("%s: exit %d, stderr %q; want exit 2 naming %s", tc.yaml, code, stderr, tc.key)
		}
	}
	good := writeFile(t, "good.yaml", fmt.Sprintf("primary: {bytes: 64MiB}\nserver: {unix_socket: %s/k.sock}\nsecondary_tiers: [{name: d, type: fs, root_dir: %s}]\n",
		dir, filepath.Join(dir, "data")))
	if code, _, stderr := runCLI(t, "", "serve", "--check-config", "--config", good); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Fatalf("--check-config created %v", entries)
	}
}
