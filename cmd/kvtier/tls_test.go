package main

import (
	"bytes"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/tlsconfig/tlstest"
)

// startMutualTLSDaemon starts a daemon whose TCP API serves mutual TLS;
// it returns the daemon, the CA, and a client certificate and key the
// daemon accepts.
func startMutualTLSDaemon(t *testing.T) (a *peerDaemon, ca, clientCert, clientKey string) {
	t.Helper()
	ca, sc, sk, cc, ck := tlstest.PKI(t, t.TempDir())
	a = &peerDaemon{name: "A", tcp: freeTCP(t), dir: shortTempDir(t)}
	a.startWith(t, "[]", fmt.Sprintf(", tls: {cert_file: %q, key_file: %q, client_ca_file: %q}", sc, sk, ca))
	return a, ca, cc, ck
}

// A daemon serving its TCP API over mutual TLS: a peer tier with the CA
// and a client certificate loads from it; one without a client
// certificate is refused (a miss, not an error).
func TestPeerTierOverMutualTLS(t *testing.T) {
	a, ca, cc, ck := startMutualTLSDaemon(t)
	block := bytes.Repeat([]byte{4, 3, 2, 1}, 1024)
	key := offload.MakeKey([]byte("tls-block-0001"), 0)
	if _, err := a.c.PutBlocks(ctxFor(t), []client.Block{{Key: key, Data: block}}, client.CallOptions{}); err != nil {
		t.Fatal(err)
	}
	b := startPeerDaemon(t, "B", fmt.Sprintf(`[{name: fleet, type: peer, peers: [{name: a, addr: %q,
  tls: {ca_file: %q, cert_file: %q, key_file: %q}}]}]`, a.tcp, ca, cc, ck))
	if got, ok := b.get(t, key, ""); !ok || !bytes.Equal(got, block) {
		t.Fatalf("over mutual TLS: hit %v, bytes equal %v", ok, bytes.Equal(got, block))
	}
	// Trusts the CA but has no client certificate: the handshake fails.
	c := startPeerDaemon(t, "C", fmt.Sprintf(`[{name: fleet, type: peer, peers: [{name: a, addr: %q, tls: {ca_file: %q}}]}]`, a.tcp, ca))
	if _, ok := c.get(t, key, ""); ok {
		t.Fatal("a peer without a client certificate loaded over mutual TLS")
	}
	// Plaintext to a TLS listener: refused too.
	plain, err := client.Dial(a.tcp, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if _, err := plain.Stats(ctxFor(t)); err == nil {
		t.Fatal("a plaintext call succeeded on the TLS listener")
	}
}

// The operator commands against a mutual-TLS daemon: with the CA and a
// client certificate they work; without the certificate, without TLS,
// with another CA or the wrong name, the message names the cause.
func TestClientCommandsOverMutualTLS(t *testing.T) {
	a, ca, cc, ck := startMutualTLSDaemon(t)
	otherCA, _, _, _, _ := tlstest.PKI(t, t.TempDir())

	stats := func(env map[string]string, flags ...string) (int, string) {
		t.Helper()
		for k, v := range env {
			t.Setenv(k, v)
		}
		code, _, stderr := runCLI(t, "", append([]string{"stats", "--target", a.tcp, "--timeout", "5s"}, flags...)...)
		return code, stderr
	}
	if code, stderr := stats(nil, "--tls-ca", ca, "--tls-cert", cc, "--tls-key", ck); code != 0 {
		t.Fatalf("mutual TLS: exit %d: %s", code, stderr)
	}
	// The same from the environment.
	if code, stderr := stats(map[string]string{"KVTIER_TLS_CA": ca, "KVTIER_TLS_CERT": cc, "KVTIER_TLS_KEY": ck}); code != 0 {
		t.Fatalf("mutual TLS from $KVTIER_TLS_*: exit %d: %s", code, stderr)
	}
	for k := range map[string]bool{"KVTIER_TLS_CA": true, "KVTIER_TLS_CERT": true, "KVTIER_TLS_KEY": true} {
		t.Setenv(k, "")
	}
	for _, tc := range []struct {
		name  string
		flags []string
		want  string
	}{
		{"no client certificate", []string{"--tls-ca", ca}, "wants a TLS client certificate"},
		{"plaintext", nil, "if it serves TLS (server.tls), pass --tls-ca"},
		{"another CA", []string{"--tls-ca", otherCA, "--tls-cert", cc, "--tls-key", ck}, "not signed by a CA this client trusts"},
		{"wrong name", []string{"--tls-ca", ca, "--tls-cert", cc, "--tls-key", ck, "--tls-server-name", "elsewhere.example"}, "not for the name dialled"},
		{"cert without key", []string{"--tls-ca", ca, "--tls-cert", cc}, "--tls-cert and --tls-key go together"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stderr := stats(nil, tc.flags...)
			t.Log(strings.TrimSpace(stderr))
			if code == 0 || !strings.Contains(stderr, tc.want) {
				t.Fatalf("exit %d, stderr %q; want a failure saying %q", code, stderr, tc.want)
			}
		})
	}
	// TLS names a TCP daemon: a Unix socket target is refused with a reason.
	code, _, stderr := runCLI(t, "", "stats", "--target", filepath.Join(a.dir, "k.sock"), "--tls-ca", ca)
	if code == 0 || !strings.Contains(stderr, "TLS applies to a TCP daemon") {
		t.Fatalf("unix target with --tls-ca: exit %d, %q", code, stderr)
	}
}
