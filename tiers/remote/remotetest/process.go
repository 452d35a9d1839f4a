package remotetest

import (
	"crypto/rand"
	"encoding/hex"
	"io"
	"net"
	"os"
	"os/exec"
	"testing"
	"time"
)

// RequireIntegration skips the test because what (a server, a binary,
// an environment variable) is not available, or fails it when
// KVTIER_REQUIRE_INTEGRATION=1 says integration tests must run.
func RequireIntegration(t testing.TB, what string) {
	t.Helper()
	if os.Getenv("KVTIER_REQUIRE_INTEGRATION") == "1" {
		t.Fatalf("KVTIER_REQUIRE_INTEGRATION=1 but %s is not available", what)
	}
	t.Skipf("%s not available; set it (see scripts/test.sh) to run this integration test", what)
}

// UniqueName returns "kvtier-it-" and 12 random hex digits: a bucket or
// key prefix no other test run uses on a shared server.
func UniqueName() string {
	var b [6]byte
	rand.Read(b[:])
	return "kvtier-it-" + hex.EncodeToString(b[:])
}

// FreeAddr returns a loopback address with a port nobody listens on.
func FreeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// Process is a server process a test owns (redis-server, versitygw),
// restartable with the same arguments, hence on the same address.
type Process struct {
	t     testing.TB
	name  string
	args  []string
	ready func() error
	wait  time.Duration

	cmd    *exec.Cmd
	exited chan struct{}
}

// StartProcess runs args (the binary first) until the test ends. Start
// returns once ready succeeds, polling it for up to wait.
func StartProcess(t testing.TB, name string, args []string, ready func() error, wait time.Duration) *Process {
	t.Helper()
	p := &Process{t: t, name: name, args: args, ready: ready, wait: wait}
	t.Cleanup(p.Stop)
	p.Start()
	return p
}

// Start starts the process and waits until it is ready.
func (p *Process) Start() {
	p.t.Helper()
	p.cmd = exec.Command(p.args[0], p.args[1:]...)
	p.cmd.Stdout, p.cmd.Stderr = io.Discard, io.Discard
	if err := p.cmd.Start(); err != nil {
		p.t.Fatalf("start %s: %v", p.name, err)
	}
	p.exited = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) { cmd.Wait(); close(done) }(p.cmd, p.exited)
	deadline := time.Now().Add(p.wait)
	for {
		err := p.ready()
		if err == nil {
			return
		}
		select {
		case <-p.exited:
			p.t.Fatalf("%s exited at start", p.name)
		default:
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("%s not ready: %v", p.name, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop kills the process and waits for it to exit. It is idempotent.
func (p *Process) Stop() {
	if p.cmd == nil {
		return
	}
	p.cmd.Process.Kill()
	<-p.exited
	p.cmd = nil
}
