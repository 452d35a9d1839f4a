package zmtp

import (
	"context"
	"log/slog"
	"time"
)

// acceptPause paces an accept loop after a failed Accept (out of file
// descriptors, usually): it waits 50 ms, doubling to 1 s while the
// failures go on, and logs at most every 10 s, so that a flood of
// connections costs neither a busy loop nor a flooded log.
type acceptPause struct {
	d      time.Duration
	logged time.Time
	quiet  int
}

// wait logs err (rate-limited) and sleeps; it reports false when ctx ended.
func (a *acceptPause) wait(ctx context.Context, log *slog.Logger, what string, err error) bool {
	if now := time.Now(); now.Sub(a.logged) >= 10*time.Second {
		log.Warn(what+": accept failed; retrying", "err", err, "similar_since_last", a.quiet)
		a.logged, a.quiet = now, 0
	} else {
		a.quiet++
	}
	a.d = min(max(2*a.d, 50*time.Millisecond), time.Second)
	t := time.NewTimer(a.d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// ok resets the pause after a successful Accept.
func (a *acceptPause) ok() { a.d = 0 }
