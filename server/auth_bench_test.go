package server

import (
	"fmt"
	"testing"

	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/tap"
)

// BenchmarkAuthCheck is what authenticating one call costs the daemon
// (issue 42: the check moved to the call's headers): the bearer token read
// from the headers and matched, for the admin (a constant-time compare)
// and for one of 64 tenants (a SHA-256 of the token and a map lookup),
// and a token-less call on the Unix socket whose uid server.unix_peers
// maps (a map lookup).
func BenchmarkAuthCheck(b *testing.B) {
	var tenants []TenantConfig
	for i := range 64 {
		tenants = append(tenants, TenantConfig{Name: fmt.Sprint("t", i), Token: fmt.Sprintf("tenant-token-%02d-0123456789", i), Namespaces: []string{""}})
	}
	tn, err := newTenancy("admin-token-0123456789", tenants, nil)
	if err != nil {
		b.Fatal(err)
	}
	if err := tn.setUnixPeers(map[int]string{1000: "admin"}); err != nil {
		b.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		md   metadata.MD
		from caller
	}{
		{"admin", metadata.Pairs("authorization", "Bearer admin-token-0123456789"), caller{}},
		{"tenant", metadata.Pairs("authorization", "Bearer tenant-token-42-0123456789"), caller{}},
		{"unix-uid", metadata.MD{}, caller{local: true, peer: unixPeer{uid: 1000, known: true}}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			info := &tap.Info{FullMethodName: "/kvtier.v1.KVTier/Lookup", Header: tc.md}
			b.ReportAllocs()
			for b.Loop() {
				tok, has := bearerOf(info.Header)
				if _, err := tn.authenticate(tok, has, tc.from); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
