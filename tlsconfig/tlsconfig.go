// Package tlsconfig builds the TLS configurations of kvtier's TCP
// listeners and of its clients (peer tiers) from PEM files named in the
// config, with errors that name the file.
package tlsconfig

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// Server returns the configuration of a TLS listener serving certFile and
// keyFile. With clientCAFile every client must present a certificate that
// CA signed (mutual TLS). The protocols offered are HTTP/2's (gRPC).
func Server(certFile, keyFile, clientCAFile string) (*tls.Config, error) {
	if certFile == "" || keyFile == "" {
		return nil, errors.New("tls: cert_file and key_file are both required")
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("tls: %s / %s: %w", certFile, keyFile, err)
	}
	c := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12, NextProtos: []string{"h2"}}
	if clientCAFile != "" {
		pool, err := pool(clientCAFile)
		if err != nil {
			return nil, err
		}
		c.ClientCAs = pool
		c.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return c, nil
}

// Client returns the configuration of a TLS client that trusts caFile
// (the system roots when empty) and, with certFile and keyFile, presents
// that certificate. serverName overrides the name checked against the
// server's certificate (default: the host dialled).
func Client(caFile, certFile, keyFile, serverName string) (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: serverName}
	if caFile != "" {
		p, err := pool(caFile)
		if err != nil {
			return nil, err
		}
		c.RootCAs = p
	}
	switch {
	case certFile != "" && keyFile != "":
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("tls: %s / %s: %w", certFile, keyFile, err)
		}
		c.Certificates = []tls.Certificate{cert}
	case certFile != "" || keyFile != "":
		return nil, errors.New("tls: cert_file and key_file go together")
	}
	return c, nil
}

// ClientFiles names the PEM files of a TLS client connection, as a tier's
// config spells them: ca_file to trust (default: the system's roots),
// cert_file and key_file to present (mutual TLS), server_name to check
// instead of the host dialled.
type ClientFiles struct {
	CAFile     string `yaml:"ca_file"`
	CertFile   string `yaml:"cert_file"`
	KeyFile    string `yaml:"key_file"`
	ServerName string `yaml:"server_name"`
}

// Config returns the client configuration f names (see Client); nil for
// a nil f: no TLS.
func (f *ClientFiles) Config() (*tls.Config, error) {
	if f == nil {
		return nil, nil
	}
	return Client(f.CAFile, f.CertFile, f.KeyFile, f.ServerName)
}

func pool(file string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("tls: %w", err)
	}
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("tls: %s holds no PEM certificate", file)
	}
	return p, nil
}
