package server_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/server"
)

// Idle connections on the arena side channel delay no one: a client gets
// the descriptor while 40 connections that never send their line are
// still open (their timeout is an hour here, so the fetch cannot have
// waited them out); past 256 exchanges in flight a new connection is
// refused at once, with a reason, and counted; once the idle ones go, a
// fetch works again.
func TestSideChannelIdleConnectionsDelayNoOne(t *testing.T) {
	e := startEnv(t, envOptions{limits: server.Limits{SideChannelTimeout: time.Hour}})
	path := e.unix + ".arena"
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var idle []net.Conn
	defer func() {
		for _, c := range idle {
			c.Close()
		}
	}()
	dialIdle := func(n int) {
		for range n {
			c, err := net.Dial("unix", path)
			if err != nil {
				t.Fatal(err)
			}
			idle = append(idle, c)
		}
	}
	dialIdle(40)
	f, err := client.ReceiveArenaFD(ctx, path, "", "")
	if err != nil {
		t.Fatalf("fetch behind 40 idle connections: %v", err)
	}
	f.Close()
	// The idle connections were not dropped to make room.
	for i, c := range idle {
		c.SetReadDeadline(time.Now().Add(time.Millisecond))
		if _, err := c.Read(make([]byte, 1)); err == nil || !isTimeout(err) {
			t.Fatalf("idle connection %d: %v, want it still open", i, err)
		}
	}

	dialIdle(256 - 40)
	// The server accepts in order: once it refuses this one, the 256
	// before it are in flight.
	var refusal error
	deadline := time.Now().Add(time.Minute)
	for refusal == nil && time.Now().Before(deadline) {
		f, err := client.ReceiveArenaFD(ctx, path, "", "")
		if err == nil {
			f.Close() // an idle one had not been accepted yet
			continue
		}
		refusal = err
	}
	if refusal == nil || !strings.Contains(refusal.Error(), "exchanges in flight") {
		t.Fatalf("fetch past 256 in flight: %v, want a refusal naming the limit", refusal)
	}
	if m := scrape(t, e); !strings.Contains(m, "kvtier_arena_side_channel_refused_total ") || strings.Contains(m, "kvtier_arena_side_channel_refused_total 0\n") {
		t.Fatal("kvtier_arena_side_channel_refused_total did not count the refusal")
	}
	for _, c := range idle {
		c.Close()
	}
	idle = nil
	for {
		f, err := client.ReceiveArenaFD(ctx, path, "", "")
		if err == nil {
			f.Close()
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("fetch after the idle connections closed: %v", err)
		}
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}
