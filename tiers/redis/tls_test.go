package redis

import (
	"context"
	"crypto/tls"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	rt "github.com/kvtier/kvtier/tiers/remote/remotetest"
	"github.com/kvtier/kvtier/tlsconfig"
	"github.com/kvtier/kvtier/tlsconfig/tlstest"
)

// A redis-server that serves only TLS and requires client certificates:
// a tier with the CA and a client certificate stores and loads 2 MiB
// blocks (its own connections and go-redis' both speak TLS: a store, a
// lookup, a load, keyspace events); one without a client certificate, or
// speaking plain TCP, is refused at start-up with an error that says so.
func TestIntegrationTLS(t *testing.T) {
	srv, files, pingTLS := startTLSRedis(t)
	ca := files.CAFile
	cfg := itConfig(srv.addr)
	cfg.KeyspaceEvents = true
	cfg.TLS = files
	tier := newTier(t, cfg)
	rec := &roundTrips{}
	tier.client.AddHook(rec)
	const n = 4
	keys := rt.Keys(900, n)
	roundTrip(t, tier, keys, 2<<20, n)
	if st := tier.Stats(); st.Retries != 0 || st.BlocksStored != n || st.BlocksLoaded != n {
		t.Fatalf("stats %+v: every transfer should have gone through on the first attempt", st)
	}
	for _, sent := range rec.take() {
		if strings.Contains(sent, "set") || strings.Contains(sent, "get") {
			t.Fatalf("%q went through go-redis: the tier's own TLS connections failed", sent)
		}
	}
	tier.TakeEvents()
	// Keyspace events arrive over the TLS subscription.
	raw := goredis.NewClient(&goredis.Options{Addr: srv.addr, TLSConfig: pingTLS})
	defer raw.Close()
	if err := raw.Del(context.Background(), tier.redisKey(keys[0])).Err(); err != nil {
		t.Fatal(err)
	}
	rt.Eventually(t, 10*time.Second, "the removal reported", func() bool {
		for _, ev := range tier.TakeEvents() {
			if ev.Removed && len(ev.Keys) == 1 && ev.Keys[0] == keys[0] {
				return true
			}
		}
		return false
	})

	for name, files := range map[string]*tlsconfig.ClientFiles{
		"no client certificate": {CAFile: ca},
		"plain TCP":             nil,
	} {
		cfg := itConfig(srv.addr)
		cfg.TLS = files
		tier, err := New(context.Background(), cfg)
		if err == nil {
			tier.Close(context.Background())
			t.Fatalf("%s: the tier started", name)
		}
		t.Logf("%s: refused: %v", name, err)
	}

	cfg = itConfig(srv.addr)
	cfg.TLS = &tlsconfig.ClientFiles{CAFile: "/nonexistent/ca.pem"}
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "tls: ") || !strings.Contains(err.Error(), "/nonexistent/ca.pem") {
		t.Errorf("a missing CA file: %v", err)
	}
}

// startTLSRedis starts a redis-server that serves only TLS and requires
// client certificates, and returns it, the files of a client it accepts
// (as a tier's tls: names them) and that client's configuration.
func startTLSRedis(t testing.TB) (*redisServer, *tlsconfig.ClientFiles, *tls.Config) {
	t.Helper()
	ca, sc, sk, cc, ck := tlstest.PKI(t, t.TempDir())
	files := &tlsconfig.ClientFiles{CAFile: ca, CertFile: cc, KeyFile: ck}
	tc, err := files.Config()
	if err != nil {
		t.Fatal(err)
	}
	srv := startRedisOn(t, tc, func(port string) []string {
		return []string{"--port", "0", "--tls-port", port, "--tls-cert-file", sc, "--tls-key-file", sk,
			"--tls-ca-cert-file", ca, "--tls-auth-clients", "yes"}
	})
	return srv, files, tc
}
