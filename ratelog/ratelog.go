package ratelog

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// DefaultInterval is the zero Limiter's interval.
const DefaultInterval = 10 * time.Second

// maxKeys bounds the keys a Limiter remembers: callers use a handful of
// fixed keys; a caller that keys by something unbounded (a remote
// address) must not grow the map without end.
const maxKeys = 1024

// Limiter writes at most one line per key per Interval.
type Limiter struct {
	// Interval between lines of one key (0: DefaultInterval).
	Interval time.Duration
	// Now is the clock (nil: time.Now), for tests.
	Now func() time.Time

	mu   sync.Mutex
	keys map[string]*state
}

type state struct {
	last       time.Time
	suppressed int
}

// Log writes msg at level with args to log unless a line of key was
// written less than Interval ago, in which case it only counts it. A line
// written after some were suppressed carries "suppressed" with their
// number. It reports whether the line was written.
func (l *Limiter) Log(log *slog.Logger, level slog.Level, key, msg string, args ...any) bool {
	if log == nil {
		return false
	}
	now := time.Now
	if l.Now != nil {
		now = l.Now
	}
	every := l.Interval
	if every <= 0 {
		every = DefaultInterval
	}
	t := now()
	l.mu.Lock()
	if l.keys == nil {
		l.keys = make(map[string]*state)
	}
	st := l.keys[key]
	if st == nil {
		if len(l.keys) >= maxKeys {
			clear(l.keys) // counts of forgotten keys are lost, never the lines
		}
		st = &state{}
		l.keys[key] = st
	} else if t.Sub(st.last) < every {
		st.suppressed++
		l.mu.Unlock()
		return false
	}
	n := st.suppressed
	st.last, st.suppressed = t, 0
	l.mu.Unlock()
	if n > 0 {
		args = append(args, "suppressed", n)
	}
	log.Log(context.Background(), level, msg, args...)
	return true
}

// Warn is Log at slog.LevelWarn.
func (l *Limiter) Warn(log *slog.Logger, key, msg string, args ...any) bool {
	return l.Log(log, slog.LevelWarn, key, msg, args...)
}
