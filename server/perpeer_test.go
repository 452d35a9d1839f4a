package server_test

import (
	"context"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	kvtierv1 "github.com/kvtier/kvtier/api/kvtier/v1"
	"github.com/kvtier/kvtier/server"
)

// TestConnectionsPerPeer: one host's authenticated connections stop at
// max_connections_per_peer — its next one is refused, counted — while
// another host is still served.
func TestConnectionsPerPeer(t *testing.T) {
	e := startEnv(t, envOptions{slots: 8, tiers: noTiers, token: daemonToken, limits: server.Limits{MaxConnectionsPerPeer: 3}})
	ctx := ctxT(t)
	from := func(ip string) (kvtierv1.KVTierClient, func()) {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
		cc, err := grpc.NewClient("passthrough:///"+e.tcp, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) { return d.DialContext(ctx, "tcp", addr) }))
		if err != nil {
			t.Fatal(err)
		}
		return kvtierv1.NewKVTierClient(cc), func() { cc.Close() }
	}
	call := func(c kvtierv1.KVTierClient) error {
		// The test's own deadline, not a short one: a refused connection
		// fails at once, and a busy machine must not fail an accepted one.
		_, err := c.Stats(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+daemonToken), &kvtierv1.StatsRequest{})
		return err
	}
	for i := range 3 {
		c, done := from("127.0.0.1")
		defer done()
		if err := call(c); err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
	}
	extra, done := from("127.0.0.1")
	defer done()
	if err := call(extra); err == nil {
		t.Fatal("a fourth authenticated connection of one host was served")
	}
	other, done2 := from("127.0.0.2")
	defer done2()
	if err := call(other); err != nil {
		t.Fatalf("another host: %v", err)
	}
	m := scrapeUntil(t, e, func(p string) bool {
		v, _ := metricValue(p, "kvtier_auth_refusals_total", `listener="tcp"`, `reason="per_peer"`)
		return v >= 1
	})
	if v, _ := metricValue(m, "kvtier_auth_refusals_total", `listener="tcp"`, `reason="per_peer"`); v < 1 {
		t.Fatal("the refusal is not counted")
	}
}
