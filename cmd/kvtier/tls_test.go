package main

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvtier/kvtier/client"
	"github.com/kvtier/kvtier/offload"
)

// testPKI writes a CA and two certificates it signed (one for a server on
// 127.0.0.1, one for a client) as PEM files in dir.
func testPKI(t *testing.T, dir string) (ca, serverCert, serverKey, clientCert, clientKey string) {
	t.Helper()
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	key := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	caKey := key()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kvtier test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	ca = write("ca.pem", "CERTIFICATE", caDER)
	leaf := func(serial int64, name string, usage x509.ExtKeyUsage) (string, string) {
		k := key()
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
			IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kb, err := x509.MarshalECPrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		return write(name+".pem", "CERTIFICATE", der), write(name+".key", "EC PRIVATE KEY", kb)
	}
	serverCert, serverKey = leaf(2, "server", x509.ExtKeyUsageServerAuth)
	clientCert, clientKey = leaf(3, "client", x509.ExtKeyUsageClientAuth)
	return
}

// A daemon serving its TCP API over mutual TLS: a peer tier with the CA
// and a client certificate loads from it; one without a client
// certificate is refused (a miss, not an error).
func TestPeerTierOverMutualTLS(t *testing.T) {
	pki := t.TempDir()
	ca, sc, sk, cc, ck := testPKI(t, pki)
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
