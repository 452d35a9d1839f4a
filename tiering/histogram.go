package tiering

import "time"

// JobBounds are the upper bounds (seconds) of the job latency histograms:
// 100 µs to 26 s in steps of ×4.
var JobBounds = []float64{1e-4, 4e-4, 1.6e-3, 6.4e-3, 0.0256, 0.1024, 0.4096, 1.6384, 6.5536, 26.2144}

// Histogram is a cumulative histogram in seconds, Prometheus style:
// Counts[i] is the number of observations <= Bounds[i].
type Histogram struct {
	Bounds []float64
	Counts []uint64
	Count  uint64
	Sum    float64
}

// histogram records job latencies (from submission to result) per tier.
type histogram struct {
	counts [11]uint64 // len(JobBounds)+1, the last is +Inf
	sum    float64
	n      uint64
}

func (h *histogram) observe(d time.Duration) {
	s := d.Seconds()
	i := 0
	for i < len(JobBounds) && s > JobBounds[i] {
		i++
	}
	h.counts[i]++
	h.sum += s
	h.n++
}

// snapshot returns h as a cumulative Histogram.
func (h *histogram) snapshot() *Histogram {
	out := &Histogram{Bounds: JobBounds, Counts: make([]uint64, len(JobBounds)), Count: h.n, Sum: h.sum}
	var cum uint64
	for i := range JobBounds {
		cum += h.counts[i]
		out.Counts[i] = cum
	}
	return out
}
