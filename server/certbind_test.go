package server_test

import (
	"bytes"
	"context"
	"path/filepath"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/cpu"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/server"
	"github.com/kvtier/kvtier/tiering"
	"github.com/kvtier/kvtier/tlsconfig"
	"github.com/kvtier/kvtier/tlsconfig/tlstest"
)

// TestClientCertificateNamesTheTenant: with mutual TLS, a tenant bound to
// a certificate's common name is that certificate's holder — without a
// token, on the API and on the block stream — and its token alone, or
// with another tenant's certificate, is refused.
func TestClientCertificateNamesTheTenant(t *testing.T) {
	dir := shortTempDir(t)
	ca, srvCert, srvKey, clients := tlstest.PKIClients(t, dir, "acme-engine", "beta-engine", "stranger")
	stls, err := tlsconfig.Server(srvCert, srvKey, ca)
	if err != nil {
		t.Fatal(err)
	}
	p, err := cpu.New(cpu.Config{SlotSize: slotSize, Capacity: 64 * slotSize})
	if err != nil {
		t.Fatal(err)
	}
	m, err := tiering.New(tiering.Config{Primary: p})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Config{
		Namespaces: []server.NamespaceConfig{server.ManagerNamespace("", m, p, offload.Parser{})},
		UnixSocket: filepath.Join(dir, "k.sock"), TCPAddr: "127.0.0.1:0", StreamAddr: "127.0.0.1:0", TLS: stls, MetricsAddr: "127.0.0.1:0",
		AuthToken: "admin-token-0123456789",
		Tenants: []server.TenantConfig{
			{Name: "acme", Token: "acme-token-0123456789", Namespaces: []string{""}, ClientCertCN: "acme-engine"},
			{Name: "beta", Token: "beta-token-0123456789", Namespaces: []string{""}, ClientCertCN: "beta-engine"},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Shutdown(context.Background()) })
	ctx := ctxT(t)
	dial := func(cert int, token string, noStream bool) *client.Client {
		t.Helper()
		ctls, err := tlsconfig.Client(ca, clients[cert][0], clients[cert][1], "")
		if err != nil {
			t.Fatal(err)
		}
		c, err := client.Dial(srv.TCPAddr(), client.Options{TLS: ctls, Token: token, NoStream: noStream})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	k := key(7)
	block := bytes.Repeat([]byte{'a'}, slotSize)
	for _, noStream := range []bool{true, false} {
		acme := dial(0, "", noStream)
		if _, err := acme.PutBlocks(ctx, []client.Block{{Key: k, Data: block}}, client.CallOptions{}); err != nil {
			t.Fatalf("acme by its certificate (stream %v): %v", !noStream, err)
		}
		got, err := acme.GetBlocks(ctx, []offload.Key{k}, client.GetOptions{})
		if err != nil || got.Hits != 1 || !bytes.Equal(got.Data[0], block) {
			t.Fatalf("acme reads its block back (stream %v): %v %v", !noStream, got, err)
		}
		// beta by its certificate: a key space of its own, and no admin call.
		beta := dial(1, "", noStream)
		if got, err := beta.GetBlocks(ctx, []offload.Key{k}, client.GetOptions{}); err != nil || got.Hits != 0 {
			t.Fatalf("beta read acme's block (stream %v): %v %v", !noStream, got, err)
		}
		if _, err := beta.ListBlocks(ctx, 0, 1); status.Code(err) != codes.PermissionDenied {
			t.Fatalf("beta's certificate made an admin call: %v", err)
		}
	}
	// The by-value calls went on the block stream, authenticated by the
	// certificate there too (a refused stream would have fallen back to
	// the API).
	page := scrapeURL(t, "http://"+srv.MetricsAddr()+"/metrics")
	if v, _ := metricValue(page, "kvtier_stream_requests_total", `kind="put_blocks"`, `result="ok"`); v < 1 {
		t.Fatalf("no put on the block stream:\n%s", page)
	}
	for _, tc := range []struct {
		name  string
		cert  int
		token string
		want  codes.Code
	}{
		{"acme's token with beta's certificate", 1, "acme-token-0123456789", codes.Unauthenticated},
		{"acme's token with a stranger's certificate", 2, "acme-token-0123456789", codes.Unauthenticated},
		{"a stranger's certificate alone", 2, "", codes.Unauthenticated},
		{"acme's token with its certificate", 0, "acme-token-0123456789", codes.OK},
		{"the admin's token with any certificate", 2, "admin-token-0123456789", codes.OK},
	} {
		_, err := dial(tc.cert, tc.token, true).Stats(ctx)
		if status.Code(err) != tc.want {
			t.Fatalf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
}
