package tierset

import (
	"os"
	"slices"
	"testing"

	"github.com/kvtier/kvtier/config"
	"github.com/kvtier/kvtier/explain"
	"github.com/kvtier/kvtier/offload"
)

// TestExampleConfigs keeps the example configs valid: they parse, and
// every tier declares what the comments say.
func TestExampleConfigs(t *testing.T) {
	for _, tc := range []struct {
		file string
		want []explain.Declaration
	}{
		{"../examples/tiers.yaml", []explain.Declaration{
			{Name: "scratch", Type: "memory", Medium: offload.MediumCPU, Locality: offload.LocalityLocal},
			{Name: "local-ssd", Type: "fs", Medium: offload.MediumStorage, Locality: offload.LocalityLocal},
			{Name: "remote-dram", Type: "redis", Medium: offload.MediumCPU, Locality: offload.LocalityRemote},
			{Name: "objects", Type: "s3", Medium: offload.MediumStorage, Locality: offload.LocalityRemote},
		}},
		{"../examples/explain.yaml", []explain.Declaration{
			{Name: "local-ssd", Type: "memory", Medium: offload.MediumStorage, Locality: offload.LocalityLocal},
			{Name: "s3", Type: "memory", Medium: offload.MediumStorage, Locality: offload.LocalityRemote},
			{Name: "redis", Type: "memory", Medium: offload.MediumCPU, Locality: offload.LocalityRemote},
			{Name: "peer", Type: "memory", Medium: offload.MediumUnspecified, Locality: offload.LocalityUnspecified},
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
