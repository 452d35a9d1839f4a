package redis

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/tiers/redis/slotpipe"
	rt "github.com/kvtier/kvtier/tiers/remote/remotetest"
)

// A server that stalls in the middle of a store never keeps the block's
// slot: once the tier has started sending the block, the manager can take
// it back (Revoke) while the server still reads nothing, the slot can be
// reused, and the server still gets the block's bytes as they were.
func TestStalledServerDoesNotHoldTheSlot(t *testing.T) {
	m := miniredis.RunT(t) // for the tier's start-up ping; stores go to the stalling server
	cfg := testConfig(m.Addr())
	cfg.Timeout = time.Minute // no timeout ends the stall for the tier
	tier := newTier(t, cfg)
	const slot = 16 << 20 // more than a socket takes at once
	arena := rt.NewArena(slot, 1)
	arena.Fill(0, 7)
	orig, _ := arena.Slot(0)
	orig = bytes.Clone(orig)

	started := make(chan struct{})
	resume := make(chan struct{})
	got := make(chan []byte, 1)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		r := bufio.NewReader(nc)
		if _, err := r.Peek(16); err != nil { // the SET has begun
			return
		}
		close(started)
		<-resume
		var n int
		if _, err := fmt.Fscanf(r, "*%d\r\n", &n); err != nil || n != 3 {
			return
		}
		var value []byte
		for range n { // SET, the key, the value
			var l int
			if _, err := fmt.Fscanf(r, "$%d\r\n", &l); err != nil {
				return
			}
			value = make([]byte, l+2)
			if _, err := io.ReadFull(r, value); err != nil {
				return
			}
		}
		got <- value[:len(value)-2]
		io.WriteString(nc, "+OK\r\n")
	}()
	tier.pipes = slotpipe.New(slotpipe.Options{Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, ln.Addr().String())
	}})

	job := rt.StoreJob(1, arena, rt.Keys(0, 1), rt.Slots(0, 1))
	job.Claims = offload.NewClaims(1)
	tier.SubmitStore(job)
	<-started
	rt.Eventually(t, 10*time.Second, "the block taken back while the server stalls", func() bool {
		return job.Claims.Revoke(0)
	})
	s, _ := arena.Slot(0)
	clear(s) // the primary reuses the slot
	close(resume)
	select {
	case v := <-got:
		if len(v) != 32+slot || !bytes.Equal(v[32:], orig) {
			t.Fatal("the server got other bytes than the block had when the tier sent it")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the server never got the block")
	}
	if res := rt.WaitJobs(t, tier, 1, 10*time.Second)[0]; !res.Success {
		t.Fatalf("store %+v", res)
	}
}
