package server_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/offload"
)

// The issue 11 findings that need a real daemon process, each the test
// of what a hostile operator or a careless user did.

// blockOf is the test content of key k at the daemon's block size.
func blockOf(k offload.Key) []byte {
	return bytes.Repeat([]byte(k.Hash()), daemonBlock/len(k.Hash())+1)[:daemonBlock]
}

func putAll(t *testing.T, c *client.Client, ks []offload.Key) {
	t.Helper()
	var blocks []client.Block
	for _, k := range ks {
		blocks = append(blocks, client.Block{Key: k, Data: blockOf(k)})
	}
	if _, err := c.PutBlocks(ctxT(t), blocks, client.CallOptions{}); err != nil {
		t.Fatal(err)
	}
}

func checkAll(t *testing.T, c *client.Client, ks []offload.Key) {
	t.Helper()
	got, err := c.GetBlocks(ctxT(t), ks, client.GetOptions{Wait: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if got.Hits != len(ks) {
		t.Fatalf("%d of %d hits: %v", got.Hits, len(ks), got.Results)
	}
	for i, k := range ks {
		if !bytes.Equal(got.Data[i], blockOf(k)) {
			t.Fatalf("block %s: wrong bytes", k)
		}
	}
}

// runKvtier runs `kvtier args...` to completion and returns its exit code
// and output.
func runKvtier(t *testing.T, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, kvtierBinary(t), args...).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), string(out)
	}
	if err != nil {
		t.Fatal(err)
	}
	return 0, string(out)
}

// Finding 1: a second `kvtier serve` with the same config (file arena)
// truncated and deleted the running daemon's arena before it found the
// socket in use; the first then served all-zero blocks. It must refuse
// before touching anything, and an unrelated file named as the arena is
// never truncated.
func TestSecondStartLeavesTheFirstDaemonAlone(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the kvtier binary")
	}
	dir := shortTempDir(t)
	arena := filepath.Join(dir, "arena")
	cfg := daemonConfig(t, dir, "")
	// A file arena, as in the finding.
	b, _ := os.ReadFile(cfg)
	os.WriteFile(cfg, bytes.Replace(b, []byte("arena: {kind: memfd}"), []byte("arena: {kind: file, path: "+arena+"}"), 1), 0o600)
	d := startDaemon(t, cfg)
	c, err := client.Dial(d.unix, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ks := keys(100, 32)
	putAll(t, c, ks)

	code, out := runKvtier(t, "serve", "--config", cfg)
	if code == 0 || !strings.Contains(out, "server.unix_socket") || !strings.Contains(out, "another kvtier daemon serves it") {
		t.Fatalf("second daemon: exit %d\n%s", code, out)
	}
	if fi, err := os.Stat(arena); err != nil || fi.Size() != 64*daemonBlock {
		t.Fatalf("the running daemon's arena after the second start: %v, %v", fi, err)
	}
	checkAll(t, c, ks) // 32 of 32 hits with the stored bytes, not zeros

	// Another socket but the same arena path: refused by the arena lock.
	cfg2 := filepath.Join(dir, "second.yaml")
	b, _ = os.ReadFile(cfg)
	b = bytes.Replace(b, []byte(filepath.Join(dir, "k.sock")), []byte(filepath.Join(dir, "k2.sock")), 1)
	b = bytes.Replace(b, []byte("root_dir: "+filepath.Join(dir, "data")), []byte("root_dir: "+filepath.Join(dir, "data2")), 1)
	os.WriteFile(cfg2, b, 0o600)
	code, out = runKvtier(t, "serve", "--config", cfg2)
	if code == 0 || !strings.Contains(out, "arena in use by another process") {
		t.Fatalf("daemon on the same arena: exit %d\n%s", code, out)
	}
	checkAll(t, c, ks)

	// A file that is not an arena.
	notes := filepath.Join(dir, "notes.txt")
	os.WriteFile(notes, []byte("precious"), 0o644)
	cfg3 := filepath.Join(dir, "third.yaml")
	os.WriteFile(cfg3, bytes.Replace(b, []byte("path: "+arena), []byte("path: "+notes), 1), 0o600)
	code, out = runKvtier(t, "serve", "--config", cfg3)
	if got, _ := os.ReadFile(notes); code == 0 || string(got) != "precious" || !strings.Contains(out, "not a kvtier arena") {
		t.Fatalf("daemon on an unrelated file: exit %d, file now %q\n%s", code, got, out)
	}
	d.stop(t)
}

// helperEnv names the socket a re-executed test binary connects to as a
// client that takes pins and reservations and then waits to be killed.
const helperEnv = "KVTIER_TEST_HOLD_CLIENT"

// TestMain's helper mode: see holdAndWait.
func init() {
	if target := os.Getenv(helperEnv); target != "" {
		holdAndWait(target)
		os.Exit(0)
	}
}

// holdAndWait reserves and pins what it can in the daemon at target,
// says so on stdout, and blocks until killed.
func holdAndWait(target string) {
	c, err := client.Dial(target, client.Options{})
	if err != nil {
		fmt.Println("dial:", err)
		os.Exit(2)
	}
	ctx := context.Background()
	if _, err := c.NewRequest(ctx, "greedy", ""); err != nil {
		fmt.Println("new request:", err)
		os.Exit(2)
	}
	ks := keys(9000, 24)
	for i := range 4 {
		if _, err := c.PrepareLoad(ctx, "greedy", ks[i:i+1]); err != nil {
			fmt.Println("prepare load:", err)
			os.Exit(2)
		}
	}
	if _, err := c.PrepareStore(ctx, "greedy", ks[4:], nil); err != nil {
		fmt.Println("prepare store:", err)
		os.Exit(2)
	}
	fmt.Println("holding")
	select {}
}

// Finding 4: two kill -9'd clients blocked every store of every client on
// a 128-slot primary until a Reset or restart. Their sessions end with
// their connections: everything they held is released.
func TestKilledClientsReleaseWhatTheyHeld(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the kvtier binary")
	}
	dir := shortTempDir(t)
	d := startDaemon(t, daemonConfig(t, dir, ""))
	c, err := client.Dial(d.unix, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The greedy clients pin four blocks each: store them first.
	putAll(t, c, keys(9000, 4))
	var helpers []*exec.Cmd
	for range 2 {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), helperEnv+"="+d.unix)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		line, _ := bufio.NewReader(out).ReadString('\n')
		if line != "holding\n" {
			cmd.Process.Kill()
			t.Fatalf("helper client: %q", line)
		}
		helpers = append(helpers, cmd)
	}
	st, err := c.Stats(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if p := st.GetPrimary(); p.GetPendingSlots() != 20 || p.GetPinnedSlots() != 4 {
		t.Fatalf("with the helpers holding: %+v", p)
	}
	for _, h := range helpers {
		h.Process.Signal(syscall.SIGKILL)
		h.Wait()
	}
	waitStats(t, c, func(s statsView) bool { return s.pending == 0 && s.pinned == 0 && s.active == 0 })
	if st, err := c.Stats(ctxT(t)); err != nil || st.GetReleasedRequests() != 2 {
		t.Fatalf("released requests %d (%v), want the helpers' 2", st.GetReleasedRequests(), err)
	}
	// Every slot is usable again.
	putAll(t, c, keys(20000, 60))
	d.stop(t)
}

type statsView struct{ pending, pinned, active int64 }

// waitStats polls Stats until cond holds: the daemon notices a dead
// connection when its socket closes, which the test cannot wait on.
func waitStats(t *testing.T, c *client.Client, cond func(statsView) bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		st, err := c.Stats(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		v := statsView{st.GetPrimary().GetPendingSlots(), st.GetPrimary().GetPinnedSlots(), st.GetActiveRequests()}
		if cond(v) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("stats never settled: %+v", v)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Finding 5: 300 idle connections that never send a token (and idle ZMTP
// connections on the event ports) under a 256-descriptor limit took the
// Unix-socket API down too. Each listener's connections are capped to fit
// the limit, so the Unix socket keeps serving.
func TestIdleConnectionsCannotStarveTheUnixSocket(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the kvtier binary")
	}
	dir := shortTempDir(t)
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	events := l.Addr().String()
	l.Close()
	cfg := daemonConfig(t, dir, fmt.Sprintf("events: {enabled: true, endpoint: \"tcp://%s\", mode: bind}\n", events))
	d := &daemon{cmd: exec.Command("sh", "-c", "ulimit -n 256 && exec "+kvtierBinary(t)+" serve --config "+cfg), done: make(chan error, 1)}
	startDaemonCmd(t, d, cfg)
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range 300 {
		for _, addr := range []string{d.tcp, events} {
			c, err := net.DialTimeout("tcp", addr, time.Second)
			if err == nil {
				conns = append(conns, c)
			}
		}
	}
	c, err := client.Dial(d.unix, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := c.NewRequest(ctx, "after-the-flood", ""); err != nil {
		t.Fatalf("Unix socket API after %d idle connections: %v\n%s", len(conns), err, d.log())
	}
	putAll(t, c, keys(1, 4))
	checkAll(t, c, keys(1, 4))
	if !strings.Contains(d.log(), "bounded by the file descriptor limit") {
		t.Errorf("the daemon did not say it bounded its connections:\n%s", d.log())
	}
	d.stop(t)
}

// Finding 9: SIGHUP exited without draining and left the sockets. It now
// stops the daemon like SIGTERM.
func TestSIGHUPDrainsLikeSIGTERM(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the kvtier binary")
	}
	dir := shortTempDir(t)
	d := startDaemon(t, daemonConfig(t, dir, ""))
	c, err := client.Dial(d.unix, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	putAll(t, c, keys(50, 8))
	c.Close()
	d.cmd.Process.Signal(syscall.SIGHUP)
	select {
	case err := <-d.done:
		if err != nil {
			t.Fatalf("exit after SIGHUP: %v\n%s", err, d.log())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("daemon did not stop on SIGHUP")
	}
	for _, p := range []string{d.unix, d.unix + ".arena"} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s left behind: %v", p, err)
		}
	}
	if !strings.Contains(d.log(), "shutting down") || !strings.Contains(d.log(), "stopped") {
		t.Errorf("no drain in the log:\n%s", d.log())
	}
	// The blocks were drained to the fs tier before exit.
	d = startDaemon(t, daemonConfig(t, dir, ""))
	c, err = client.Dial(d.unix, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	checkAll(t, c, keys(50, 8))
	d.stop(t)
}
