package redis

import (
	"strings"
	"testing"
	"time"

	rt "github.com/kvtier/kvtier/tiers/remote/remotetest"
)

// TestDecodeFromConfigFile decodes a tier entry the way the daemon does:
// config.Parse, then TierSpec.Decode over DefaultConfig.
func TestDecodeFromConfigFile(t *testing.T) {
	doc := `
secondary_tiers:
  - name: dram
    type: redis
    addr: 10.0.0.7:6379
    password: pw
    db: 3
    tls: {ca_file: /etc/kvtier/ca.pem, server_name: redis.internal}
    key_prefix: "llama:"
    ttl: 30m
    max_value_bytes: 4194304
    pool_size: 8
    keyspace_events: true
    locality: remote
    events: true
`
	c := DefaultConfig()
	if err := rt.DecodeTier(doc, &c); err != nil {
		t.Fatal(err)
	}
	if c.Addr != "10.0.0.7:6379" || c.Password != "pw" || c.DB != 3 || c.KeyPrefix != "llama:" || c.TTL != 30*time.Minute ||
		c.MaxValueBytes != 4<<20 || c.PoolSize != 8 || !c.KeyspaceEvents || !c.Events || c.Timeout != DefaultTimeout ||
		c.TLS == nil || c.TLS.CAFile != "/etc/kvtier/ca.pem" || c.TLS.ServerName != "redis.internal" {
		t.Fatalf("decoded %+v", c)
	}
	c.TLS = nil // the CA file is not on this machine (TestIntegrationTLS reads real ones)
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	// Sizes take units, as every other size key does.
	c = DefaultConfig()
	if err := rt.DecodeTier(strings.Replace(doc, "max_value_bytes: 4194304", "max_value_bytes: 4MiB", 1), &c); err != nil ||
		c.MaxValueBytes != 4<<20 {
		t.Fatalf("max_value_bytes: 4MiB: %d, %v", c.MaxValueBytes, err)
	}
	c = DefaultConfig()
	err := rt.DecodeTier(strings.Replace(doc, "ttl: 30m", "ttl: soon", 1), &c)
	if err == nil || !strings.Contains(err.Error(), "ttl") {
		t.Fatalf("bad ttl: %v", err)
	}
}
