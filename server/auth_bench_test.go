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
// and for one of 64 tenants (a SHA-256 of the token and a map lookup).
func BenchmarkAuthCheck(b *testing.B) {
	var tenants []TenantConfig
	for i := range 64 {
		tenants = append(tenants, TenantConfig{Name: fmt.Sprint("t", i), Token: fmt.Sprintf("tenant-token-%02d-0123456789", i), Namespaces: []string{""}})
	}
	tn, err := newTenancy("admin-token-0123456789", tenants, nil)
	if err != nil {
		b.Fatal(err)
	}
	for _, tc := range []struct{ name, token string }{
		{"admin", "admin-token-0123456789"},
		{"tenant", "tenant-token-42-0123456789"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			info := &tap.Info{FullMethodName: "/kvtier.v1.KVTier/Lookup", Header: metadata.Pairs("authorization", "Bearer "+tc.token)}
			b.ReportAllocs()
			for b.Loop() {
				tok, has := bearerOf(info.Header)
				if _, err := tn.authenticate(tok, has, caller{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
