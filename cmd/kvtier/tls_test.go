package main

import (
	"bytes"
	"fmt"
	"os"
	"testing"

	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/tlsconfig/tlstest"
)

// A daemon serving its TCP API over mutual TLS: a peer tier with the CA
// and a client certificate loads from it; one without a client
// certificate is refused (a miss, not an error).
func TestPeerTierOverMutualTLS(t *testing.T) {
	pki := t.TempDir()
	ca, sc, sk, cc, ck := tlstest.PKI(t, pki)
	a := &peerDaemon{name: "A", tcp: freeTCP(t)}
	var err error
	if a.dir, err = os.MkdirTemp("", "kvp"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(a.dir) })
	a.startWith(t, "[]", fmt.Sprintf(", tls: {cert_file: %q, key_file: %q, client_ca_file: %q}", sc, sk, ca))
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
