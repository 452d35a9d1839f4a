package offload

import (
	"container/list"
	"context"
	"log/slog"
	"sync"
	"time"
)

// Defaults of WarningLogOptions.
const (
	DefaultWarningInterval    = time.Minute
	DefaultMaxWarningMessages = 1024
	// maxWarningReasons bounds the per-reason counters. The parser emits
	// four reasons; anything beyond the bound is counted as "other".
	maxWarningReasons = 64
)

// WarningLogOptions configures a WarningLog. The zero value is usable.
type WarningLogOptions struct {
	// Interval is the minimum time between two log lines carrying the
	// same message. 0 means DefaultWarningInterval; a negative value logs
	// every occurrence (upstream behaviour).
	Interval time.Duration
	// MaxMessages caps the distinct messages remembered; when full, the
	// least recently seen one is forgotten (it logs again on its next
	// occurrence). 0 means DefaultMaxWarningMessages.
	MaxMessages int
	// OnCount, if set, is called once for every recorded warning with its
	// reason, outside the log's lock (e.g. to increment a Prometheus
	// counter vector).
	OnCount func(reason string)
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// WarningLog logs lenient-mode filter warnings without flooding: each
// distinct message is logged at most once per interval, and the next line
// for it reports how many repeats were suppressed in between. Every
// warning is counted by reason. A client that keeps sending the same typo
// stays visible in the log and in the counters at a bounded cost.
//
// Plug it into a parser with Parser{OnWarning: wl.Record}. A WarningLog is
// safe for concurrent use.
type WarningLog struct {
	logger   *slog.Logger
	interval time.Duration
	max      int
	onCount  func(string)
	now      func() time.Time

	mu      sync.Mutex
	counts  map[string]uint64
	entries map[string]*list.Element // message → element of lru
	lru     list.List                // *warnEntry, most recently seen first
}

type warnEntry struct {
	message    string
	lastLogged time.Time
	suppressed uint64
}

// NewWarningLog returns a WarningLog writing to logger (nil means
// slog.Default()) at level WARN.
func NewWarningLog(logger *slog.Logger, opts WarningLogOptions) *WarningLog {
	if logger == nil {
		logger = slog.Default()
	}
	if opts.Interval == 0 {
		opts.Interval = DefaultWarningInterval
	}
	if opts.MaxMessages <= 0 {
		opts.MaxMessages = DefaultMaxWarningMessages
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &WarningLog{
		logger:   logger,
		interval: opts.Interval,
		max:      opts.MaxMessages,
		onCount:  opts.OnCount,
		now:      opts.Now,
		counts:   make(map[string]uint64),
		entries:  make(map[string]*list.Element),
	}
}

// Record counts w and logs it unless the same message was logged less
// than the interval ago. Its signature fits Parser.OnWarning.
func (wl *WarningLog) Record(w Warning) {
	now := wl.now()
	reason := w.Reason

	wl.mu.Lock()
	if _, known := wl.counts[reason]; !known && len(wl.counts) >= maxWarningReasons {
		reason = "other"
	}
	wl.counts[reason]++
	logIt, suppressed := wl.admitLocked(w.Message, now)
	wl.mu.Unlock()

	if wl.onCount != nil {
		wl.onCount(reason)
	}
	if !logIt {
		return
	}
	attrs := []slog.Attr{
		slog.String("field", w.Field),
		slog.String("reason", w.Reason),
		slog.Int("entry", w.Entry),
		slog.String("value", w.Value),
	}
	if suppressed > 0 {
		attrs = append(attrs, slog.Uint64("suppressed", suppressed))
	}
	wl.logger.LogAttrs(context.Background(), slog.LevelWarn, w.Message, attrs...)
}

// admitLocked decides whether message is logged now and returns the
// repeats suppressed since its previous line.
func (wl *WarningLog) admitLocked(message string, now time.Time) (logIt bool, suppressed uint64) {
	if el, ok := wl.entries[message]; ok {
		wl.lru.MoveToFront(el)
		e := el.Value.(*warnEntry)
		// A clock that steps backwards must not silence a message for
		// longer than an interval, so compare both ways.
		if d := now.Sub(e.lastLogged); wl.interval < 0 || d >= wl.interval || d < 0 {
			suppressed, e.suppressed, e.lastLogged = e.suppressed, 0, now
			return true, suppressed
		}
		e.suppressed++
		return false, 0
	}
	if wl.lru.Len() >= wl.max {
		oldest := wl.lru.Back()
		delete(wl.entries, oldest.Value.(*warnEntry).message)
		wl.lru.Remove(oldest)
	}
	wl.entries[message] = wl.lru.PushFront(&warnEntry{message: message, lastLogged: now})
	return true, 0
}

// Counts returns the number of warnings recorded per reason since the log
// was created.
func (wl *WarningLog) Counts() map[string]uint64 {
	wl.mu.Lock()
	defer wl.mu.Unlock()
	out := make(map[string]uint64, len(wl.counts))
	for r, n := range wl.counts {
		out[r] = n
	}
	return out
}

// Tracked returns the number of distinct messages currently remembered
// (at most MaxMessages).
func (wl *WarningLog) Tracked() int {
	wl.mu.Lock()
	defer wl.mu.Unlock()
	return wl.lru.Len()
}
