// Package tlstest makes the certificates of TLS tests: a CA and a server
// and a client certificate it signed, as PEM files.
package tlstest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// PKI writes a CA and two certificates it signed (one for a server on
// 127.0.0.1, one for a client) as PEM files in dir and returns their
// paths. The certificates are valid for an hour.
func PKI(t testing.TB, dir string) (ca, serverCert, serverKey, clientCert, clientKey string) {
	t.Helper()
	ca, serverCert, serverKey, clients := PKIClients(t, dir, "client")
	return ca, serverCert, serverKey, clients[0][0], clients[0][1]
}

// PKIClients is PKI with a client certificate for each of names (its
// common name), returned as {cert, key} paths in the order of names.
func PKIClients(t testing.TB, dir string, names ...string) (ca, serverCert, serverKey string, clients [][2]string) {
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
	for i, name := range names {
		c, k := leaf(int64(3+i), name, x509.ExtKeyUsageClientAuth)
		clients = append(clients, [2]string{c, k})
	}
	return
}
