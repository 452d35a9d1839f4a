//go:build !charts

package main

import (
	"errors"
	"strings"
	"testing"
)

// Without -tags charts, a chart is refused with the way to get one.
func TestChartsNeedTheBuildTag(t *testing.T) {
	if _, err := plotServing(strings.NewReader("{}"), t.TempDir()); !errors.Is(err, errNoCharts) || !strings.Contains(err.Error(), "-tags charts") {
		t.Fatalf("plotServing: %v", err)
	}
	code, _, errOut := runCLI(t, "", "bench", "plot-serving", "--out", t.TempDir(), "/dev/null")
	if code == 0 || !strings.Contains(errOut, "-tags charts") {
		t.Fatalf("plot-serving: exit %d, %q", code, errOut)
	}
}
