package main

import (
	"os"
	"testing"
)

// TestServeExampleIsTheDefault keeps examples/serve.yaml, the file users
// copy, identical to what `kvtier serve` runs without --config.
func TestServeExampleIsTheDefault(t *testing.T) {
	b, err := os.ReadFile("../../examples/serve.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != defaultServeConfig {
		t.Errorf("examples/serve.yaml differs from the embedded default; regenerate it with\n  go run ./cmd/kvtier serve --print-default-config > examples/serve.yaml")
	}
}
