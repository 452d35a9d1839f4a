package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	kvtierv1 "github.com/kvtier/kvtier/api/kvtier/v1"
	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/offload"
)

// netns is a network namespace joined to the test's by a veth pair:
// hostIP on the test's side, nsIP inside.
type netns struct {
	name, hostDev, nsDev, hostIP, nsIP string
}

func ipCmd(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// newNetns creates the namespace, or skips the test with the reason when
// this machine does not let it (not root, no CAP_NET_ADMIN, no ip). With
// KVTIER_REQUIRE_NETNS=1 (the test script sets it once it has created a
// namespace itself) it fails instead.
func newNetns(t *testing.T) *netns {
	t.Helper()
	id := os.Getpid() % 10000
	n := &netns{name: fmt.Sprintf("kvt%d", id), hostDev: fmt.Sprintf("kvth%d", id), nsDev: fmt.Sprintf("kvtn%d", id),
		hostIP: "10.203.0.1", nsIP: "10.203.0.2"}
	if err := ipCmd("netns", "add", n.name); err != nil {
		if os.Getenv("KVTIER_REQUIRE_NETNS") == "1" {
			t.Fatalf("cannot create a network namespace: %v", err)
		}
		t.Skipf("partition test skipped: cannot create a network namespace here (%v); run as root with CAP_NET_ADMIN", err)
	}
	t.Cleanup(func() {
		_ = ipCmd("link", "del", n.hostDev)
		_ = ipCmd("netns", "del", n.name)
	})
	for _, args := range [][]string{
		{"link", "add", n.hostDev, "type", "veth", "peer", "name", n.nsDev},
		{"link", "set", n.nsDev, "netns", n.name},
		{"addr", "add", n.hostIP + "/30", "dev", n.hostDev},
		{"link", "set", n.hostDev, "up"},
		{"-n", n.name, "addr", "add", n.nsIP + "/30", "dev", n.nsDev},
		{"-n", n.name, "link", "set", n.nsDev, "up"},
		{"-n", n.name, "link", "set", "lo", "up"},
	} {
		if err := ipCmd(args...); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

// inside runs fn on an OS thread that has joined the namespace: sockets
// fn creates belong to it and keep serving from any thread afterwards.
func (n *netns) inside(t *testing.T, fn func()) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		self, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			done <- err
			return
		}
		defer self.Close()
		target, err := os.Open("/var/run/netns/" + n.name)
		if err != nil {
			done <- err
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			done <- err
			return
		}
		fn()
		if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
			done <- err // the thread stays locked and dies with the goroutine
			return
		}
		runtime.UnlockOSThread()
		done <- nil
	}()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// A peer behind a link that goes down costs misses within the call
// timeout, shows unhealthy, and is used again by itself once the link is
// back. The peer's address is not loopback, so its locality is derived
// remote.
func TestPeerTierPartition(t *testing.T) {
	n := newNetns(t)
	dir, err := os.MkdirTemp("", "kvp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	a := &peerDaemon{name: "A", dir: dir, tcp: n.nsIP + ":7070"}
	n.inside(t, func() { a.start(t, "[]") })

	b := startPeerDaemon(t, "B", fmt.Sprintf(`[{name: fleet, type: peer, timeout: 500ms, unhealthy_after: 1, probe_interval: 200ms,
  peers: [{name: a, addr: %q}]}]`, a.tcp))
	block := bytes.Repeat([]byte{9, 8, 7, 6}, 1024)
	put := func(name string) offload.Key {
		k := offload.MakeKey([]byte("partition-"+name), 0)
		if _, err := a.c.PutBlocks(ctxFor(t), []client.Block{{Key: k, Data: block}}, client.CallOptions{}); err != nil {
			t.Fatal(err)
		}
		return k
	}
	// Remote: a local-only request does not reach it.
	k1 := put("k1")
	if _, ok := b.get(t, k1, `{"kv_load_tiers":[{"locality":"local"}]}`); ok {
		t.Fatal("local-only request loaded from a remote peer")
	}
	if got, ok := b.get(t, k1, ""); !ok || !bytes.Equal(got, block) {
		t.Fatal("no hit across the veth pair")
	}

	if err := ipCmd("link", "set", n.hostDev, "down"); err != nil {
		t.Fatal(err)
	}
	k2 := put("k2") // A is up, only unreachable
	start := time.Now()
	if _, ok := b.get(t, k2, ""); ok {
		t.Fatal("hit across a partition")
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("a partitioned peer held a get for %v", d)
	}
	waitFor(t, func() bool {
		_, _ = b.get(t, k2, "")
		st, err := b.c.Stats(ctxFor(t))
		return err == nil && !st.GetTiers()[0].GetHealthy()
	})

	if err := ipCmd("link", "set", n.hostDev, "up"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		got, err := b.c.GetBlocks(ctxFor(t), []offload.Key{k2}, client.GetOptions{Wait: 3 * time.Second})
		return err == nil && got.Results[0] == kvtierv1.LookupResult_LOOKUP_RESULT_HIT && bytes.Equal(got.Data[0], block)
	})
}
