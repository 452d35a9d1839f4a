//go:build !charts

package main

import (
	"errors"
	"io"
)

// errNoCharts answers a chart asked of a binary built without them.
var errNoCharts = errors.New("this kvtier was built without charts (the daemon does not link the plotting library): " +
	"build one with `go build -tags charts -o kvtier-charts ./cmd/kvtier`, or run `go run -tags charts ./cmd/kvtier ...`")

func writePlot(string, *benchReport) error            { return errNoCharts }
func writeFleetPlot(string, *fleetReport) error       { return errNoCharts }
func plotServing(io.Reader, string) ([]string, error) { return nil, errNoCharts }
