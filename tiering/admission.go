package tiering

import (
	"fmt"
	"time"
)

// AdmissionConfig configures back-pressure detection (docs/semantics.md §4.10). The
// zero value means the defaults: α = 0.3, high = 1 s, low = 0.5 s,
// warmup = 3.
//
// Each secondary tier keeps an exponential moving average of the latency
// of its successful cascades. A tier is under pressure once the average
// exceeds High and until it drops below Low; while it is, cascades to it
// are dropped (the blocks stay in the primary only) and counted, except
// that one cascade is admitted whenever the tier has none in flight, so
// that fresh latency samples can clear the pressure once the tier
// recovers. Promotions are always admitted.
type AdmissionConfig struct {
	// Disabled turns back-pressure off: every cascade is admitted.
	Disabled bool
	// Alpha is the EMA weight of a new sample, in (0, 1].
	Alpha float64
	// High and Low are the hysteresis thresholds (Low <= High).
	High, Low time.Duration
	// Warmup is the number of first samples ignored (cold caches, new
	// connections). Negative means none; 0 means the default.
	Warmup int
}

// Defaults of AdmissionConfig.
const (
	DefaultAlpha  = 0.3
	DefaultHigh   = time.Second
	DefaultLow    = 500 * time.Millisecond
	DefaultWarmup = 3
)

func (c AdmissionConfig) withDefaults() (AdmissionConfig, error) {
	if c.Alpha == 0 {
		c.Alpha = DefaultAlpha
	}
	if c.High == 0 {
		c.High = DefaultHigh
	}
	if c.Low == 0 {
		c.Low = DefaultLow
		if c.Low > c.High {
			c.Low = c.High
		}
	}
	switch {
	case c.Warmup == 0:
		c.Warmup = DefaultWarmup
	case c.Warmup < 0:
		c.Warmup = 0
	}
	if !(c.Alpha > 0 && c.Alpha <= 1) {
		return c, fmt.Errorf("tiering: admission alpha %v: must be in (0, 1]", c.Alpha)
	}
	if c.High < 0 || c.Low < 0 || c.Low > c.High {
		return c, fmt.Errorf("tiering: admission thresholds low %v, high %v: want 0 <= low <= high", c.Low, c.High)
	}
	return c, nil
}

// pressure is one tier's back-pressure detector.
type pressure struct {
	ema     float64 // seconds
	samples int
	active  bool
}

// sample feeds one successful cascade latency and reports whether the
// pressure state changed.
func (p *pressure) sample(d time.Duration, c *AdmissionConfig) bool {
	p.samples++
	if p.samples <= c.Warmup {
		return false
	}
	x := d.Seconds()
	if p.samples == c.Warmup+1 {
		p.ema = x
	} else {
		p.ema = c.Alpha*x + (1-c.Alpha)*p.ema
	}
	switch {
	case !p.active && p.ema > c.High.Seconds():
		p.active = true
		return true
	case p.active && p.ema < c.Low.Seconds():
		p.active = false
		return true
	}
	return false
}
