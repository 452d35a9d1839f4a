package redis

import (
	"strings"
	"testing"
	"time"

	"github.com/kvtier/kvtier/config"
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
    key_prefix: "llama:"
    ttl: 30m
    max_value_bytes: 4194304
    pool_size: 8
    keyspace_events: true
    locality: remote
    events: true
`
	cfg, err := config.Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	c := DefaultConfig()
	if err := cfg.SecondaryTiers[0].Decode(&c); err != nil {
		t.Fatal(err)
	}
	if c.Addr != "10.0.0.7:6379" || c.Password != "pw" || c.DB != 3 || c.KeyPrefix != "llama:" || c.TTL != 30*time.Minute ||
		c.MaxValueBytes != 4<<20 || c.PoolSize != 8 || !c.KeyspaceEvents || !c.Events || c.Timeout != DefaultTimeout {
		t.Fatalf("decoded %+v", c)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	bad, err := config.Parse([]byte(strings.Replace(doc, "ttl: 30m", "ttl: soon", 1)))
	if err == nil {
		c := DefaultConfig()
		err = bad.SecondaryTiers[0].Decode(&c)
	}
	if err == nil || !strings.Contains(err.Error(), "ttl") {
		t.Fatalf("bad ttl: %v", err)
	}
}
