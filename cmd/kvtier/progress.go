package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvtier/kvtier/workload"
)

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
