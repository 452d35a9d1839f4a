// Package plot draws the charts of `kvtier bench --plot`: a replay's hit
// rate split by where the hits came from, and hit rate against primary
// size for a configuration next to the plain-LRU reference. It lives in
// its own package so that gonum/plot stays out of every other package of
// the daemon.
package plot

import (
	"fmt"
	"image/color"
	"io"
	"math"
	"sort"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// Split is one bar of the hit-rate chart: a source of hits (the primary,
// or a tier's promotions) and its share of all blocks.
type Split struct {
	Label string
	Rate  float64
}

// Point is one replay of the size sweep.
type Point struct {
	PrimaryBlocks int
	HitRate       float64 // with the configured tiers
	LRUHitRate    float64 // plain LRU of the same size, from the trace alone
}

// Report is what the chart shows.
type Report struct {
	Title string
	// Splits are the main replay's hits by source; their sum is its hit
	// rate.
	Splits []Split
	// PrimaryOnly is the plain-LRU hit rate at the main replay's primary
	// size, MaxHitRate the trace's unbounded hit rate.
	PrimaryOnly, MaxHitRate float64
	// Sweep is hit rate against primary size (may be empty).
	Sweep []Point
}

// palette is colour-blind safe (Okabe-Ito).
var palette = []color.Color{
	color.RGBA{0, 114, 178, 255}, color.RGBA{230, 159, 0, 255}, color.RGBA{0, 158, 115, 255},
	color.RGBA{204, 121, 167, 255}, color.RGBA{86, 180, 233, 255}, color.RGBA{213, 94, 0, 255},
	color.RGBA{240, 228, 66, 255},
}

// WritePNG draws r as a PNG of width×height points into w.
func WritePNG(w io.Writer, r Report, width, height vg.Length) error {
	plots := []*plot.Plot{}
	split, err := splitPlot(r)
	if err != nil {
		return err
	}
	plots = append(plots, split)
	if len(r.Sweep) > 0 {
		sweep, err := sweepPlot(r)
		if err != nil {
			return err
		}
		plots = append(plots, sweep)
	}
	img := vgimg.New(width, height)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 1, Cols: len(plots), PadX: vg.Millimeter * 4, PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	canvases := plot.Align([][]*plot.Plot{plots}, tiles, dc)
	for i, p := range plots {
		p.Draw(canvases[0][i])
	}
	_, err = vgimg.PngCanvas{Canvas: img}.WriteTo(w)
	return err
}

// splitPlot is a stacked bar of the hit rate by source, with the
// primary-only and maximum references as horizontal lines.
func splitPlot(r Report) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = r.Title
	p.Y.Label.Text = "prefix hit rate"
	p.Y.Min = 0
	top := math.Max(r.MaxHitRate, r.PrimaryOnly)
	var bars []*plotter.BarChart
	total := 0.0
	for i, s := range r.Splits {
		b, err := plotter.NewBarChart(plotter.Values{s.Rate}, vg.Points(60))
		if err != nil {
			return nil, fmt.Errorf("plot: %w", err)
		}
		b.Color = palette[i%len(palette)]
		b.LineStyle.Width = 0
		if i > 0 {
			b.StackOn(bars[i-1])
		}
		bars = append(bars, b)
		p.Add(b)
		p.Legend.Add(fmt.Sprintf("%s %.4f", s.Label, s.Rate), b)
		total += s.Rate
	}
	top = math.Max(top, total)
	for _, ref := range []struct {
		label string
		v     float64
		dash  bool
	}{{"primary alone (LRU)", r.PrimaryOnly, true}, {"maximum (unbounded)", r.MaxHitRate, false}} {
		if ref.v <= 0 {
			continue
		}
		l, err := plotter.NewLine(plotter.XYs{{X: -0.6, Y: ref.v}, {X: 0.6, Y: ref.v}})
		if err != nil {
			return nil, fmt.Errorf("plot: %w", err)
		}
		l.Width = vg.Points(1.5)
		if ref.dash {
			l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		}
		p.Add(l)
		p.Legend.Add(fmt.Sprintf("%s %.4f", ref.label, ref.v), l)
	}
	p.Y.Max = top * 1.25
	p.X.Min, p.X.Max = -1, 1
	p.NominalX(fmt.Sprintf("total %.4f", total))
	p.Legend.Top = true
	return p, nil
}

// sweepPlot is hit rate against primary size: the configuration's and
// plain LRU's.
func sweepPlot(r Report) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "hit rate against primary size"
	p.X.Label.Text = "primary blocks"
	p.Y.Label.Text = "prefix hit rate"
	p.Y.Min = 0
	cfg := make(plotter.XYs, len(r.Sweep))
	lru := make(plotter.XYs, len(r.Sweep))
	top := r.MaxHitRate
	for i, pt := range r.Sweep {
		cfg[i] = plotter.XY{X: float64(pt.PrimaryBlocks), Y: pt.HitRate}
		lru[i] = plotter.XY{X: float64(pt.PrimaryBlocks), Y: pt.LRUHitRate}
		top = math.Max(top, math.Max(pt.HitRate, pt.LRUHitRate))
	}
	for i, s := range []struct {
		label string
		xy    plotter.XYs
	}{{"with the configured tiers", cfg}, {"primary alone (LRU)", lru}} {
		l, pts, err := plotter.NewLinePoints(s.xy)
		if err != nil {
			return nil, fmt.Errorf("plot: %w", err)
		}
		l.Color, pts.Color = palette[i], palette[i]
		l.Width = vg.Points(1.5)
		p.Add(l, pts)
		p.Legend.Add(s.label, l, pts)
	}
	if r.MaxHitRate > 0 && len(r.Sweep) > 0 {
		xs := []float64{cfg[0].X, cfg[len(cfg)-1].X}
		l, err := plotter.NewLine(plotter.XYs{{X: xs[0], Y: r.MaxHitRate}, {X: xs[1], Y: r.MaxHitRate}})
		if err != nil {
			return nil, fmt.Errorf("plot: %w", err)
		}
		l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		l.Color = color.Gray{Y: 100}
		p.Add(l)
		p.Legend.Add(fmt.Sprintf("maximum %.4f", r.MaxHitRate), l)
	}
	p.Y.Max = top * 1.15
	p.Legend.Top = true
	p.Legend.Left = false
	p.Add(plotter.NewGrid())
	return p, nil
}

// Bar is one bar of a stacked-bar chart: a configuration and its value
// split by source.
type Bar struct {
	Label  string
	Splits []Split // the same sources, in the same order, on every bar
}

// Bars is a chart of stacked bars, one per configuration, with an
// optional reference value drawn as a horizontal line.
type Bars struct {
	Title, YLabel string
	Bars          []Bar
	// Ref is drawn when > 0, labelled RefLabel.
	Ref      float64
	RefLabel string
	// Format prints a bar's total under its label (default %.4f).
	Format string
}

// WriteFleetPNG draws the fleet chart into w: one stacked bar per
// configuration, with the single-node maximum as a horizontal line.
func WriteFleetPNG(w io.Writer, title string, bars []Bar, maxHitRate float64, width, height vg.Length) error {
	return WriteBarsPNG(w, Bars{Title: title, YLabel: "fleet prefix hit rate", Bars: bars, Ref: maxHitRate, RefLabel: "maximum (unbounded)"}, width, height)
}

// WriteBarsPNG draws c as a PNG of width×height points into w.
func WriteBarsPNG(w io.Writer, c Bars, width, height vg.Length) error {
	if len(c.Bars) == 0 {
		return fmt.Errorf("plot: no bars")
	}
	format := c.Format
	if format == "" {
		format = "%.4f"
	}
	p := plot.New()
	p.Title.Text = c.Title
	p.Y.Label.Text = c.YLabel
	p.Y.Min = 0
	var stacked []*plotter.BarChart
	top := c.Ref
	totals := make([]float64, len(c.Bars))
	for s := range c.Bars[0].Splits {
		vals := make(plotter.Values, len(c.Bars))
		for i, b := range c.Bars {
			if s < len(b.Splits) {
				vals[i] = b.Splits[s].Rate
				totals[i] += b.Splits[s].Rate
			}
		}
		bc, err := plotter.NewBarChart(vals, vg.Points(40))
		if err != nil {
			return fmt.Errorf("plot: %w", err)
		}
		bc.Color = palette[s%len(palette)]
		bc.LineStyle.Width = 0
		if s > 0 {
			bc.StackOn(stacked[s-1])
		}
		stacked = append(stacked, bc)
		p.Add(bc)
		p.Legend.Add(c.Bars[0].Splits[s].Label, bc)
	}
	labels := make([]string, len(c.Bars))
	for i, b := range c.Bars {
		labels[i] = b.Label + "\n" + fmt.Sprintf(format, totals[i])
		top = math.Max(top, totals[i])
	}
	if c.Ref > 0 {
		l, err := plotter.NewLine(plotter.XYs{{X: -0.5, Y: c.Ref}, {X: float64(len(c.Bars)) - 0.5, Y: c.Ref}})
		if err != nil {
			return fmt.Errorf("plot: %w", err)
		}
		l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		l.Color = color.Gray{Y: 100}
		p.Add(l)
		p.Legend.Add(c.RefLabel+" "+fmt.Sprintf(format, c.Ref), l)
	}
	p.NominalX(labels...)
	if top <= 0 {
		top = 1
	}
	p.Y.Max = top * 1.6 // room for the legend above the bars
	p.Legend.Top = true
	img := vgimg.New(width, height)
	p.Draw(draw.New(img))
	_, err := vgimg.PngCanvas{Canvas: img}.WriteTo(w)
	return err
}

// Series is one line of a CDF chart: a configuration's samples.
type Series struct {
	Label  string
	Values []float64
}

// WriteCDFPNG draws the empirical CDF of each series (x: the sample
// value, y: the share of samples at or below it) as a PNG of
// width×height points into w.
func WriteCDFPNG(w io.Writer, title, xlabel string, series []Series, width, height vg.Length) error {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = xlabel
	p.Y.Label.Text = "share of requests"
	p.Y.Min, p.Y.Max = 0, 1
	p.X.Min = 0
	drawn := 0
	for i, s := range series {
		if len(s.Values) == 0 {
			continue
		}
		v := append([]float64(nil), s.Values...)
		sort.Float64s(v)
		xy := make(plotter.XYs, 0, 2*len(v)+1)
		xy = append(xy, plotter.XY{X: v[0], Y: 0})
		for j, x := range v {
			// A step: the share jumps at each sample.
			xy = append(xy, plotter.XY{X: x, Y: float64(j) / float64(len(v))}, plotter.XY{X: x, Y: float64(j+1) / float64(len(v))})
		}
		l, err := plotter.NewLine(xy)
		if err != nil {
			return fmt.Errorf("plot: %s: %w", s.Label, err)
		}
		l.Color = palette[i%len(palette)]
		l.Width = vg.Points(1.5)
		if i >= len(palette) {
			l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		}
		p.Add(l)
		p.Legend.Add(s.Label, l)
		drawn++
	}
	if drawn == 0 {
		return fmt.Errorf("plot: no samples")
	}
	p.Add(plotter.NewGrid())
	p.Legend.Top = false
	p.Legend.Left = false
	img := vgimg.New(width, height)
	p.Draw(draw.New(img))
	_, err := vgimg.PngCanvas{Canvas: img}.WriteTo(w)
	return err
}
