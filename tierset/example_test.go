package tierset

import (
	"os"
	"slices"
	"testing"

	"github.com/kvtier/kvtier/config"
	"github.com/kvtier/kvtier/offload"
)

// TestExampleConfigs keeps the example configs valid: they parse, and
// every tier declares what the comments say.
func TestExampleConfigs(t *testing.T) {
	for _, tc := range []struct {
		file string
		want []Declaration
	}{
		{"../examples/tiers.yaml", []Declaration{
			{"scratch", "memory", offload.MediumCPU, offload.LocalityLocal},
			{"local-ssd", "fs", offload.MediumStorage, offload.LocalityLocal},
			{"remote-dram", "redis", offload.MediumCPU, offload.LocalityRemote},
			{"objects", "s3", offload.MediumStorage, offload.LocalityRemote},
		}},
		{"../examples/explain.yaml", []Declaration{
			{"local-ssd", "memory", offload.MediumStorage, offload.LocalityLocal},
			{"s3", "memory", offload.MediumStorage, offload.LocalityRemote},
			{"redis", "memory", offload.MediumCPU, offload.LocalityRemote},
			{"peer", "memory", offload.MediumUnspecified, offload.LocalityUnspecified},
		}},
	} {
		doc, err := os.ReadFile(tc.file)
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := config.Parse(doc)
		if err != nil {
			t.Fatalf("%s: %v", tc.file, err)
		}
		decls, err := Declare(cfg)
		if err != nil {
			t.Fatalf("%s: %v", tc.file, err)
		}
		if !slices.Equal(decls, tc.want) {
			t.Errorf("%s declares %v\nwant %v", tc.file, decls, tc.want)
		}
	}
}
