package remote

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// ErrUnavailable is returned (wrapped) for work refused because the
// tier's server is marked down.
var ErrUnavailable = errors.New("server unavailable")

// ProbeFunc checks that the server answers. It must honour ctx.
type ProbeFunc func(ctx context.Context) error

// HealthOptions tune a Health. Zero values take the defaults.
type HealthOptions struct {
	// Threshold is the number of consecutive transport failures that mark
	// the server down (default 3).
	Threshold int
	// Interval is the pause between probes while down (default 1s).
	Interval time.Duration
	// Timeout bounds one probe (default 2s).
	Timeout time.Duration
	// OnRecover runs on the probe goroutine after a successful probe has
	// marked the server up again, e.g. to re-apply server settings lost in
	// a restart. It must not block for long.
	OnRecover func(ctx context.Context)
	Logger    *slog.Logger
}

// Health is the up/down state of one remote server. Tiers report every
// transport outcome; while down, a background goroutine probes the server
// every Interval and marks it up on the first success. All methods are
// safe for concurrent use and never block on I/O.
type Health struct {
	name  string
	probe ProbeFunc
	opts  HealthOptions

	up    atomic.Bool
	fails atomic.Int32
	downs atomic.Int64 // up→down transitions

	kick   chan struct{}
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once
}

// NewHealth starts the probe goroutine of a server that is initially up.
// name identifies the tier in log lines.
func NewHealth(name string, probe ProbeFunc, opts HealthOptions) *Health {
	if opts.Threshold <= 0 {
		opts.Threshold = 3
	}
	if opts.Interval <= 0 {
		opts.Interval = time.Second
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 2 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &Health{name: name, probe: probe, opts: opts, kick: make(chan struct{}, 1), ctx: ctx, cancel: cancel}
	h.up.Store(true)
	h.wg.Add(1)
	go h.run()
	return h
}

// Healthy reports whether the server is considered up.
func (h *Health) Healthy() bool { return h.up.Load() }

// Downs returns how many times the server was marked down.
func (h *Health) Downs() int64 { return h.downs.Load() }

// Success records a successful exchange with the server.
func (h *Health) Success() {
	if h.fails.Load() != 0 {
		h.fails.Store(0)
	}
}

// Failure records a transport failure (connection refused, reset,
// timeout, server error). At the threshold the server is marked down and
// probing starts.
func (h *Health) Failure(err error) {
	if h.ctx.Err() != nil {
		return // shutting down: cancellations are not the server's fault
	}
	n := h.fails.Add(1)
	if int(n) < h.opts.Threshold || !h.up.CompareAndSwap(true, false) {
		return
	}
	h.downs.Add(1)
	h.opts.Logger.Warn("remote tier marked unhealthy; answering misses until it recovers",
		"tier", h.name, "consecutive_failures", n, "err", err)
	select {
	case h.kick <- struct{}{}:
	default:
	}
}

// run waits for the server to go down, then probes it until it answers.
func (h *Health) run() {
	defer h.wg.Done()
	for {
		select {
		case <-h.ctx.Done():
			return
		case <-h.kick:
		}
		t := time.NewTimer(h.opts.Interval)
		for !h.up.Load() {
			select {
			case <-h.ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			pctx, cancel := context.WithTimeout(h.ctx, h.opts.Timeout)
			err := h.probe(pctx)
			cancel()
			if err != nil {
				t.Reset(h.opts.Interval)
				continue
			}
			if h.opts.OnRecover != nil {
				h.opts.OnRecover(h.ctx)
			}
			h.fails.Store(0)
			h.up.Store(true)
			h.opts.Logger.Info("remote tier recovered", "tier", h.name)
		}
	}
}

// Close stops probing. It is idempotent.
func (h *Health) Close() {
	h.once.Do(func() {
		h.cancel()
		h.wg.Wait()
	})
}
