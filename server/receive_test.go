package server_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	kvtierv1 "github.com/kvtier/kvtier/api/kvtier/v1"
	"github.com/kvtier/kvtier/server"
)

// Issue 42: request bytes in flight are bounded for the whole daemon.
// gRPC read a unary call's whole request before anything of the daemon
// ran; every call now reserves max_message_bytes of max_receive_bytes
// before its request is read (server/receive.go).

// trickle opens an API call on its own HTTP/2 connection that sends the
// first bytes of a request of declared bytes and then nothing: a client
// that holds the daemon's reservation for as long as it likes. It
// answers the daemon's PINGs and SETTINGS; closing conn ends the call.
func trickle(t *testing.T, addr, token, method string, declared int) (net.Conn, chan struct{}) {
	t.Helper()
	c, fr := h2conn(t, addr)
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range [][2]string{
		{":method", "POST"}, {":scheme", "http"}, {":path", method}, {":authority", addr},
		{"content-type", "application/grpc"}, {"te", "trailers"}, {"authorization", "Bearer " + token},
	} {
		if err := enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]}); err != nil {
			t.Fatal(err)
		}
	}
	if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb.Bytes(), EndHeaders: true}); err != nil {
		t.Fatal(err)
	}
	first := make([]byte, 5+100)
	binary.BigEndian.PutUint32(first[1:5], uint32(declared))
	if err := fr.WriteData(1, false, first); err != nil {
		t.Fatal(err)
	}
	return c, answerPeer(fr, func(f http2.Frame) bool {
		switch f := f.(type) {
		case *http2.HeadersFrame:
			return f.StreamEnded() // the call's trailers: it is over
		case *http2.RSTStreamFrame, *http2.GoAwayFrame:
			return true
		}
		return false
	})
}

// gauge returns the value of an unlabelled series of a /metrics page.
func gauge(page, name string) float64 {
	for _, line := range strings.Split(page, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	return -1
}

const receiveMsg = 1 << 20

// Two calls that never finish their requests hold the whole budget: a
// third call waits, without its request being read, until one of them
// goes; then it is served.
func TestReceiveBudgetBoundsRequestsInFlight(t *testing.T) {
	e := startEnv(t, envOptions{token: "admin-token-of-16-bytes", limits: server.Limits{
		MaxMessageBytes: receiveMsg, MaxReceiveBytes: 2 * receiveMsg, ReceiveTimeout: time.Hour}})
	c1, _ := trickle(t, e.tcp, e.token, kvtierv1.KVTier_PutBlocks_FullMethodName, receiveMsg-100)
	trickle(t, e.tcp, e.token, kvtierv1.KVTier_PutBlocks_FullMethodName, receiveMsg-100)
	scrapeUntil(t, e, func(p string) bool { return gauge(p, "kvtier_receive_bytes_reserved") == 2*receiveMsg })

	c := e.dial(t, e.tcp)
	served := make(chan error, 1)
	go func() {
		_, err := c.NewRequest(ctxT(t), "after-the-trickles", "")
		served <- err
	}()
	page := scrapeUntil(t, e, func(p string) bool { return gauge(p, "kvtier_receive_waiting") == 1 })
	if r := gauge(page, "kvtier_receive_bytes_reserved"); r != 2*receiveMsg {
		t.Fatalf("%v bytes reserved with a call waiting, want the budget, %d", r, 2*receiveMsg)
	}
	select {
	case err := <-served:
		t.Fatalf("a call was served past the receive budget (err %v)", err)
	default:
	}
	c1.Close()
	if err := <-served; err != nil {
		t.Fatalf("the waiting call, once a trickle went: %v", err)
	}
	scrapeUntil(t, e, func(p string) bool { return gauge(p, "kvtier_receive_bytes_reserved") == receiveMsg })
}

// A request that does not arrive within receive_timeout is cancelled and
// its reservation given back.
func TestReceiveTimeoutCancelsATrickle(t *testing.T) {
	e := startEnv(t, envOptions{token: "admin-token-of-16-bytes", limits: server.Limits{
		MaxMessageBytes: receiveMsg, MaxReceiveBytes: receiveMsg, ReceiveTimeout: 200 * time.Millisecond}})
	_, ended := trickle(t, e.tcp, e.token, kvtierv1.KVTier_PutBlocks_FullMethodName, receiveMsg-100)
	select {
	case <-ended:
	case <-ctxT(t).Done():
		t.Fatal("the trickling call was never ended")
	}
	page := scrapeUntil(t, e, func(p string) bool {
		v, _ := metricValue(p, "kvtier_receive_refusals_total", `reason="timeout"`)
		return v == 1 && gauge(p, "kvtier_receive_bytes_reserved") == 0
	})
	if v, _ := metricValue(page, "kvtier_receive_refusals_total", `reason="timeout"`); v != 1 {
		t.Fatalf("receive timeouts counted: %v, want 1", v)
	}
	if r := gauge(page, "kvtier_receive_bytes_reserved"); r != 0 {
		t.Fatalf("%v bytes still reserved after the timeout", r)
	}
	// The budget is whole again: a call is served.
	if _, err := e.dial(t, e.tcp).NewRequest(ctxT(t), "after", ""); err != nil {
		t.Fatal(err)
	}
}

// With tenants, one tenant holds at most half of the budget: acme's
// trickles leave beta served at once while acme's next call waits.
func TestReceiveBudgetShareKeepsTenantsApart(t *testing.T) {
	e := startEnv(t, envOptions{token: "admin-token-of-16-bytes",
		tenants: []server.TenantConfig{
			{Name: "acme", Token: "acme-token-of-16-bytes", Namespaces: []string{""}},
			{Name: "beta", Token: "beta-token-of-16-bytes", Namespaces: []string{""}},
		},
		limits: server.Limits{MaxMessageBytes: receiveMsg, MaxReceiveBytes: 2 * receiveMsg, ReceiveTimeout: time.Hour}})
	trickle(t, e.tcp, "acme-token-of-16-bytes", kvtierv1.KVTier_PutBlocks_FullMethodName, receiveMsg-100)
	scrapeUntil(t, e, func(p string) bool { return gauge(p, "kvtier_receive_bytes_reserved") == receiveMsg })

	acme := e.dialAs(t, "acme-token-of-16-bytes", "")
	waiting := make(chan error, 1)
	go func() {
		_, err := acme.NewRequest(context.Background(), "acme-waits", "")
		waiting <- err
	}()
	scrapeUntil(t, e, func(p string) bool { return gauge(p, "kvtier_receive_waiting") == 1 })
	beta := e.dialAs(t, "beta-token-of-16-bytes", "")
	if _, err := beta.NewRequest(ctxT(t), "beta-goes", ""); err != nil {
		t.Fatalf("beta, with acme at its share of the receive budget: %v", err)
	}
	select {
	case err := <-waiting:
		t.Fatalf("acme was served past its share (err %v)", err)
	default:
	}
}
