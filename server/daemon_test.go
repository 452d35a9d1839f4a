package server_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/config"
	"github.com/kvtier/kvtier/confvalue"
	"github.com/kvtier/kvtier/offload"
)

// These tests run the real kvtier binary: `kvtier serve --config` on temp
// paths, stopped with SIGTERM.

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
	binDir    string
)

// kvtierBinary builds ./cmd/kvtier once per test binary run.
func kvtierBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "kvtier-bin")
		if buildErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "kvtier")
		_, file, _, _ := runtime.Caller(0)
		root := filepath.Dir(filepath.Dir(file))
		cmd := exec.Command("go", "build", "-o", binPath, "./cmd/kvtier")
		cmd.Dir = root
		out, err := cmd.CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build ./cmd/kvtier: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// daemon is a running kvtier serve process.
type daemon struct {
	cmd    *exec.Cmd
	unix   string
	tcp    string
	done   chan error
	mu     sync.Mutex
	stderr bytes.Buffer
}

const daemonBlock = 4096

// daemonConfig writes a config for a daemon under dir: a memfd primary
// of 64 blocks, an fs tier under dir/data (local), TCP on a free port.
func daemonConfig(t *testing.T, dir string, extra string) string {
	t.Helper()
	cfg := fmt.Sprintf(`
namespace:
  model: test-model
  bytes_per_block: %d
primary:
  bytes: %d
  arena: {kind: memfd}
secondary_tiers:
  - name: local-disk
    type: fs
    root_dir: %s
    locality: local
server:
  unix_socket: %s
  tcp_addr: 127.0.0.1:0
  metrics_addr: ""
  shutdown_timeout: 5s
%s`, daemonBlock, 64*daemonBlock, filepath.Join(dir, "data"), filepath.Join(dir, "k.sock"), extra)
	path := filepath.Join(dir, "kvtier.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

var listenRE = regexp.MustCompile(`kvtier API listening.* tcp=(\S+)`)

func startDaemon(t *testing.T, configPath string) *daemon {
	t.Helper()
	d := &daemon{cmd: exec.Command(kvtierBinary(t), "serve", "--config", configPath), done: make(chan error, 1)}
	startDaemonCmd(t, d, configPath)
	return d
}

// startDaemonCmd starts d's command (a kvtier serve of configPath) and
// waits until it listens.
func startDaemonCmd(t *testing.T, d *daemon, configPath string) {
	t.Helper()
	pipe, err := d.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pipe)
		for sc.Scan() {
			line := sc.Text()
			d.mu.Lock()
			d.stderr.WriteString(line + "\n")
			d.mu.Unlock()
			if m := listenRE.FindStringSubmatch(line); m != nil {
				ready <- m[1]
			}
		}
		d.done <- d.cmd.Wait()
	}()
	select {
	case d.tcp = <-ready:
	case err := <-d.done:
		t.Fatalf("daemon exited at start: %v\n%s", err, d.log())
	case <-time.After(20 * time.Second):
		d.cmd.Process.Kill()
		t.Fatalf("daemon did not start:\n%s", d.log())
	}
	d.unix = filepath.Join(filepath.Dir(configPath), "k.sock")
	t.Cleanup(func() {
		if d.cmd.ProcessState == nil {
			d.cmd.Process.Kill()
			<-d.done
		}
	})
}

func (d *daemon) log() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.stderr.String()
}

// stop sends SIGTERM and requires a clean exit.
func (d *daemon) stop(t *testing.T) {
	t.Helper()
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-d.done:
		if err != nil {
			t.Fatalf("daemon exit: %v\n%s", err, d.log())
		}
	case <-time.After(20 * time.Second):
		d.cmd.Process.Kill()
		t.Fatalf("daemon did not stop:\n%s", d.log())
	}
	if _, err := os.Stat(d.unix); !os.IsNotExist(err) {
		t.Fatalf("socket %s left behind: %v", d.unix, err)
	}
}

func shortTempDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "kvd")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// TestDaemonRestartLoadsFromFS stores blocks, restarts the daemon and
// loads them back from the FS tier.
func TestDaemonRestartLoadsFromFS(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the kvtier binary")
	}
	dir := shortTempDir(t)
	cfg := daemonConfig(t, dir, "")
	d := startDaemon(t, cfg)
	if !strings.Contains(d.log(), "name=local-disk type=fs medium=STORAGE locality=LOCAL") {
		t.Errorf("start-up log lacks the fs tier line:\n%s", d.log())
	}
	ctx := ctxT(t)
	c, err := client.Dial(d.unix, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ks := keys(500, 6)
	data := func(k offload.Key) []byte {
		return bytes.Repeat([]byte(k.Hash()), daemonBlock/len(k.Hash())+1)[:daemonBlock]
	}
	var blocks []client.Block
	for _, k := range ks {
		blocks = append(blocks, client.Block{Key: k, Data: data(k)})
	}
	if _, err := c.PutBlocks(ctx, blocks, client.CallOptions{}); err != nil {
		t.Fatal(err)
	}
	for pending := true; pending; time.Sleep(2 * time.Millisecond) {
		if pending, err = c.ScheduleEnd(ctx, nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	c.Close()
	d.stop(t)

	d = startDaemon(t, cfg)
	c, err = client.Dial(d.tcp, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	got, err := c.GetBlocks(ctx, ks, client.GetOptions{CallOptions: client.CallOptions{Params: `{"kv_load_tiers": [{"medium": "storage", "locality": "local"}]}`}, Wait: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if got.Hits != len(ks) {
		t.Fatalf("after restart: %d of %d hits (%v)\n%s", got.Hits, len(ks), got.Results, d.log())
	}
	for i, k := range ks {
		if !bytes.Equal(got.Data[i], data(k)) {
			t.Fatalf("block %s differs after restart", k)
		}
	}
	d.stop(t)
}

// pythonForTest returns the interpreter for Python tests, or skips.
func pythonForTest(t *testing.T) string {
	t.Helper()
	py := os.Getenv("KVTIER_TEST_PYTHON")
	if py == "" {
		py = "/usr/bin/python3"
	}
	out, err := exec.Command(py, "-c", "import grpc, google.protobuf").CombinedOutput()
	if err != nil {
		msg := fmt.Sprintf("python %s cannot import grpc/protobuf (apt-get install python3-grpcio python3-protobuf): %v %s", py, err, out)
		if os.Getenv("KVTIER_REQUIRE_INTEGRATION") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return py
}

// TestPythonClient runs the Python example and client checks against a
// real daemon, over the Unix socket (mapped arena) and TCP (by value).
func TestPythonClient(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the kvtier binary")
	}
	py := pythonForTest(t)
	dir := shortTempDir(t)
	d := startDaemon(t, daemonConfig(t, dir, ""))
	_, file, _, _ := runtime.Caller(0)
	pyDir := filepath.Join(filepath.Dir(filepath.Dir(file)), "python")

	run := func(args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, py, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("%v: %v\n%s\ndaemon log:\n%s", args, err, out, d.log())
		}
		return string(out)
	}
	out := run(filepath.Join(pyDir, "example.py"), "--target", d.unix)
	for _, want := range []string{"through the mapped arena", "0 of 4 hits", "4 of 4 blocks loaded and verified"} {
		if !strings.Contains(out, want) {
			t.Errorf("example over unix: output lacks %q:\n%s", want, out)
		}
	}
	out = run(filepath.Join(pyDir, "example.py"), "--target", d.tcp, "--by-value", "--blocks", "3")
	if !strings.Contains(out, "3 of 3 blocks loaded and verified") {
		t.Errorf("example over tcp: %s", out)
	}
	// Errors reach Python as grpc status codes with clear messages.
	script := `
import sys, grpc
sys.path.insert(0, sys.argv[1])
import kvtier
c = kvtier.Client(sys.argv[2])
try:
    c.lookup("nope", [kvtier.make_key(b"h", 0)])
    raise SystemExit("lookup of an unknown request succeeded")
except grpc.RpcError as e:
    assert e.code() == grpc.StatusCode.NOT_FOUND, e
    assert "nope" in e.details(), e.details()
try:
    c.put_blocks([(b"abc", b"x")])
    raise SystemExit("short key accepted")
except grpc.RpcError as e:
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e
r = c.new_request("py-1", {"kv_load_tiers": "storage"})
assert r.warnings[0].reason == "not_list", r
assert r.load_filter.all
ex = c.explain({"kv_load_tiers": [{"medium": "cpu"}]})
assert [t.name for t in ex.tiers] == ["local-disk"] and not ex.tiers[0].load, ex
print("ok")
`
	out = run("-c", script, pyDir, d.unix)
	if strings.TrimSpace(out) != "ok" {
		t.Errorf("python error checks: %s", out)
	}
	d.stop(t)
}

// TestDefaultConfigValid checks that the embedded default the binary
// prints is a valid config with the promised shape.
func TestDefaultConfigValid(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the kvtier binary")
	}
	out, err := exec.Command(kvtierBinary(t), "serve", "--print-default-config").Output()
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse(out)
	if err != nil {
		t.Fatalf("embedded default: %v\n%s", err, out)
	}
	if len(cfg.SecondaryTiers) != 1 || cfg.SecondaryTiers[0].Type != "fs" || cfg.Events.Enabled ||
		cfg.Server.UnixSocket != "./kvtier.sock" || !strings.HasPrefix(cfg.Server.TCPAddr, "127.0.0.1:") ||
		!strings.HasPrefix(cfg.Server.MetricsAddr, "127.0.0.1:") || cfg.Primary.Bytes != confvalue.GiB {
		t.Fatalf("embedded default has the wrong shape: %+v", cfg)
	}
}
