package s3

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
  - name: objects
    type: s3
    bucket: kv-cache
    prefix: cluster-a
    endpoint: http://10.0.0.5:7070
    locality: remote
    io_threads: 4
    timeout: 3s
    lookup_timeout: 250ms
    retries: 0
    create_bucket: true
    events: true
    namespace:
      model_name: org/model
      rank: 2
`
	c := DefaultConfig()
	if err := rt.DecodeTier(doc, &c); err != nil {
		t.Fatal(err)
	}
	if c.Bucket != "kv-cache" || c.Prefix != "cluster-a" || c.IOThreads != 4 || c.Timeout != 3*time.Second ||
		c.LookupTimeout != 250*time.Millisecond || c.Retries != 0 || !c.CreateBucket || !c.Events ||
		c.Namespace.ModelName != "org/model" || c.Namespace.Rank != 2 || c.MaxInflight != DefaultMaxInflight {
		t.Fatalf("decoded %+v", c)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	l, err := c.layoutOf()
	if err != nil || !strings.HasPrefix(l.Base, "org_model_") || l.Rank != 2 {
		t.Fatalf("layout %+v %v", l, err)
	}

	c = DefaultConfig()
	err = rt.DecodeTier(strings.Replace(doc, "io_threads: 4", "io_thread: 4", 1), &c)
	if err == nil || !strings.Contains(err.Error(), "io_thread") {
		t.Fatalf("unknown key: %v", err)
	}
}
