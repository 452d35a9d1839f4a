package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	"gonum.org/v1/plot/vg"

	"github.com/kvtier/kvtier/workload"
	"github.com/kvtier/kvtier/workload/plot"
)

// writePlot draws rep to a PNG file.
func writePlot(name string, rep *benchReport) error {
	r := rep.Result
	pr := plot.Report{
		Title:       fmt.Sprintf("%d requests, primary %d blocks", r.Requests, r.Primary.Blocks),
		PrimaryOnly: rep.RefLRU,
		MaxHitRate:  rep.RefMax,
		Splits:      []plot.Split{{Label: "primary", Rate: rate(r.PrimaryHitBlocks, r.Blocks)}},
	}
	if rep.ConfigFile != "" {
		pr.Title += ", " + rep.ConfigFile
	}
	for _, t := range r.Tiers {
		pr.Splits = append(pr.Splits, plot.Split{Label: "from " + t.Name, Rate: rate(t.HitBlocks, r.Blocks)})
	}
	if n := r.UnattributedHitBlocks; n > 0 {
		pr.Splits = append(pr.Splits, plot.Split{Label: "promoted, tier not told apart", Rate: rate(n, r.Blocks)})
	}
	for _, p := range rep.Sweep {
		pr.Sweep = append(pr.Sweep, plot.Point{PrimaryBlocks: p.PrimaryBlocks, HitRate: p.HitRate, LRUHitRate: p.LRUHitRate})
	}
	width := 6 * vg.Inch
	if len(pr.Sweep) > 0 {
		width = 12 * vg.Inch
	}
	return writePNGFile(name, func(w io.Writer) error { return plot.WritePNG(w, pr, width, 4.5*vg.Inch) })
}

// writePNGFile creates the --plot file and draws into it; a chart that
// cannot be drawn leaves no file behind.
func writePNGFile(name string, draw func(io.Writer) error) (err error) {
	f, err := os.Create(name)
	if err != nil {
		return fmt.Errorf("--plot: %w", err)
	}
	defer func() {
		if cerr := f.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("--plot: %w", cerr)
		}
	}()
	if err := draw(f); err != nil {
		return errors.Join(fmt.Errorf("--plot %s: %w", name, err), os.Remove(name))
	}
	return nil
}

// progressLine shows a long command's progress on stderr: one line rewritten in
// place on a terminal, a line per report otherwise (when forced).
type progressLine struct {
	mu    sync.Mutex
	w     io.Writer
	tty   bool
	on    bool
	shown bool
}

func newProgressLine(w io.Writer, force bool) *progressLine {
	tty := false
	if f, ok := w.(*os.File); ok {
		_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
		tty = err == nil
	}
	return &progressLine{w: w, tty: tty, on: tty || force}
}

// report returns the Progress callback for one replay of total requests.
func (p *progressLine) report(label string, total int) func(workload.Progress) {
	if !p.on {
		return nil
	}
	return func(pr workload.Progress) {
		line := fmt.Sprintf("%s%d/%d requests (%.0f%%), hit rate %.4f, %v elapsed", label, pr.Requests, total,
			100*float64(pr.Requests)/float64(max(total, 1)), pr.HitRate, pr.Elapsed.Round(time.Second))
		if pr.Behind > time.Second {
			line += fmt.Sprintf(", %v behind the trace", pr.Behind.Round(time.Second))
		}
		p.show(line)
	}
}

// show prints line: in place on a terminal, as a line of its own
// otherwise.
func (p *progressLine) show(line string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tty {
		fmt.Fprintf(p.w, "\r%-100s", line)
		p.shown = true
		return
	}
	fmt.Fprintln(p.w, strings.TrimSpace(line))
}

// done ends the line of a replay.
func (p *progressLine) done() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.shown {
		fmt.Fprintf(p.w, "\r%-100s\r", "")
		p.shown = false
	}
}
