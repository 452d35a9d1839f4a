package offload_test

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/kvtier/kvtier/offload"
)

// captureHandler keeps every record so tests can check what was logged.
type captureHandler struct {
	mu   sync.Mutex
	recs []logLine
}

type logLine struct {
	level      slog.Level
	msg        string
	attrs      map[string]any
	suppressed uint64
}

func (h *captureHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *captureHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *captureHandler) WithGroup(string) slog.Handler            { return h }
func (h *captureHandler) Handle(_ context.Context, r slog.Record) error {
	l := logLine{level: r.Level, msg: r.Message, attrs: map[string]any{}}
	r.Attrs(func(a slog.Attr) bool {
		l.attrs[a.Key] = a.Value.Any()
		if a.Key == "suppressed" {
			l.suppressed = a.Value.Uint64()
		}
		return true
	})
	h.mu.Lock()
	h.recs = append(h.recs, l)
	h.mu.Unlock()
	return nil
}

func (h *captureHandler) lines() []logLine {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]logLine(nil), h.recs...)
}

// fakeClock is a settable clock.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func newTestLog(opts offload.WarningLogOptions) (*offload.WarningLog, *captureHandler, *fakeClock) {
	h := &captureHandler{}
	clk := &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	if opts.Now == nil {
		opts.Now = clk.Now
	}
	return offload.NewWarningLog(slog.New(h), opts), h, clk
}

func warn(reason, msg string) offload.Warning {
	return offload.Warning{Field: offload.KeyLoadTiers, Reason: reason, Entry: 0, Value: `"x"`, Message: msg}
}

func TestWarningLogRateLimit(t *testing.T) {
	wl, h, clk := newTestLog(offload.WarningLogOptions{Interval: time.Minute})
	a := warn(offload.ReasonUnknownMedium, "a")
	b := warn(offload.ReasonNotList, "b")

	// Each step: advance the clock, record, then expect the log so far.
	type line struct {
		msg        string
		suppressed uint64
	}
	steps := []struct {
		advance time.Duration
		w       offload.Warning
		want    []line
	}{
		{0, a, []line{{"a", 0}}},
		{time.Second, a, []line{{"a", 0}}},
		{time.Second, b, []line{{"a", 0}, {"b", 0}}},           // distinct message logs at once
		{57 * time.Second, a, []line{{"a", 0}, {"b", 0}}},      // 59 s after a's line: still quiet
		{time.Second, a, []line{{"a", 0}, {"b", 0}, {"a", 2}}}, // 60 s: logs, 2 repeats suppressed
		{time.Second, a, []line{{"a", 0}, {"b", 0}, {"a", 2}}},
		{time.Hour, a, []line{{"a", 0}, {"b", 0}, {"a", 2}, {"a", 1}}},
		{0, b, []line{{"a", 0}, {"b", 0}, {"a", 2}, {"a", 1}, {"b", 0}}},                    // b never repeated
		{-time.Hour, b, []line{{"a", 0}, {"b", 0}, {"a", 2}, {"a", 1}, {"b", 0}, {"b", 0}}}, // clock stepped back
	}
	for i, s := range steps {
		clk.Advance(s.advance)
		wl.Record(s.w)
		var got []line
		for _, l := range h.lines() {
			got = append(got, line{l.msg, l.suppressed})
		}
		if fmt.Sprint(got) != fmt.Sprint(s.want) {
			t.Fatalf("step %d: logged %v, want %v", i, got, s.want)
		}
	}
	want := map[string]uint64{offload.ReasonUnknownMedium: 6, offload.ReasonNotList: 3}
	if got := wl.Counts(); !maps.Equal(got, want) {
		t.Fatalf("Counts = %v, want %v", got, want)
	}
	l := h.lines()[0]
	if l.level != slog.LevelWarn || l.attrs["reason"] != offload.ReasonUnknownMedium ||
		l.attrs["field"] != offload.KeyLoadTiers || l.attrs["value"] != `"x"` || l.attrs["entry"] != int64(0) {
		t.Fatalf("log line %+v", l)
	}
	if _, ok := l.attrs["suppressed"]; ok {
		t.Fatal("first line carries a suppressed count")
	}
}

func TestWarningLogEveryOccurrence(t *testing.T) {
	wl, h, _ := newTestLog(offload.WarningLogOptions{Interval: -1})
	for range 3 {
		wl.Record(warn(offload.ReasonNotList, "same"))
	}
	if n := len(h.lines()); n != 3 {
		t.Fatalf("%d lines, want 3", n)
	}
}

// TestWarningLogBounded: only MaxMessages messages are remembered; the
// least recently seen one is forgotten and logs again at once.
func TestWarningLogBounded(t *testing.T) {
	wl, h, _ := newTestLog(offload.WarningLogOptions{MaxMessages: 3})
	for _, m := range []string{"m1", "m2", "m3", "m1", "m4"} { // m4 evicts m2, not m1
		wl.Record(warn(offload.ReasonUnknownMedium, m))
	}
	if wl.Tracked() != 3 {
		t.Fatalf("Tracked = %d, want 3", wl.Tracked())
	}
	before := len(h.lines()) // m1 m2 m3 m4
	wl.Record(warn(offload.ReasonUnknownMedium, "m1"))
	wl.Record(warn(offload.ReasonUnknownMedium, "m3"))
	if n := len(h.lines()); n != before {
		t.Fatalf("remembered messages logged again (%d lines, want %d)", n, before)
	}
	wl.Record(warn(offload.ReasonUnknownMedium, "m2"))
	if n := len(h.lines()); n != before+1 {
		t.Fatalf("forgotten message not logged again (%d lines, want %d)", n, before+1)
	}
	for i := range 10000 {
		wl.Record(warn(offload.ReasonUnknownMedium, fmt.Sprint("flood", i)))
	}
	if wl.Tracked() != 3 {
		t.Fatalf("Tracked = %d after a flood, want 3", wl.Tracked())
	}
	def := offload.NewWarningLog(slog.New(&captureHandler{}), offload.WarningLogOptions{})
	for i := range offload.DefaultMaxWarningMessages + 10 {
		def.Record(warn(offload.ReasonUnknownMedium, fmt.Sprint(i)))
	}
	if def.Tracked() != offload.DefaultMaxWarningMessages {
		t.Fatalf("default cap: Tracked = %d", def.Tracked())
	}
}

func TestWarningLogReasonCountsBounded(t *testing.T) {
	wl, _, _ := newTestLog(offload.WarningLogOptions{})
	for i := range 200 {
		wl.Record(warn(fmt.Sprint("r", i), "m"))
	}
	c := wl.Counts()
	if len(c) > 65 || c["other"] == 0 {
		t.Fatalf("%d reasons tracked, other=%d", len(c), c["other"])
	}
	var total uint64
	for _, n := range c {
		total += n
	}
	if total != 200 {
		t.Fatalf("total %d, want 200", total)
	}
}

// TestWarningLogWithParser: a client repeating a typo produces one log
// line per distinct problem, and every occurrence is counted and hooked.
func TestWarningLogWithParser(t *testing.T) {
	var mu sync.Mutex
	hooked := map[string]uint64{}
	wl, h, _ := newTestLog(offload.WarningLogOptions{OnCount: func(r string) {
		mu.Lock()
		hooked[r]++
		mu.Unlock()
	}})
	p := offload.Parser{OnWarning: wl.Record}
	const req = `{"kv_load_tiers":[{"medium":"cpuu"},"x",{"locality":"near"}],"kv_store_tiers":7}`
	const n = 50
	for range n {
		if _, err := p.NewReqContext("r", req); err != nil {
			t.Fatal(err)
		}
	}
	if got := len(h.lines()); got != 4 {
		t.Fatalf("%d log lines, want 4 (one per distinct warning)", got)
	}
	want := map[string]uint64{offload.ReasonUnknownMedium: n, offload.ReasonEntryNotObject: n,
		offload.ReasonUnknownLocality: n, offload.ReasonNotList: n}
	if got := wl.Counts(); !maps.Equal(got, want) {
		t.Fatalf("Counts = %v, want %v", got, want)
	}
	if !maps.Equal(hooked, want) {
		t.Fatalf("OnCount saw %v, want %v", hooked, want)
	}
}

func TestWarningLogConcurrent(t *testing.T) {
	var mu sync.Mutex
	var hooked int
	wl, h, _ := newTestLog(offload.WarningLogOptions{MaxMessages: 8, OnCount: func(string) {
		mu.Lock()
		hooked++
		mu.Unlock()
	}})
	const goroutines, each = 8, 500
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range each {
				wl.Record(warn(offload.ReasonNotList, "shared"))
				if i%50 == 0 {
					wl.Record(warn(offload.ReasonUnknownMedium, fmt.Sprint("g", g, "-", i)))
					_ = wl.Counts()
				}
			}
		})
	}
	wg.Wait()
	c := wl.Counts()
	if c[offload.ReasonNotList] != goroutines*each || c[offload.ReasonUnknownMedium] != goroutines*each/50 {
		t.Fatalf("Counts = %v", c)
	}
	if hooked != goroutines*each+goroutines*each/50 {
		t.Fatalf("OnCount called %d times", hooked)
	}
	var shared int
	for _, l := range h.lines() {
		if l.msg == "shared" {
			shared++
		}
	}
	// The clock never moved: "shared" may be logged again only after
	// being evicted by the distinct messages, never once per record.
	if shared < 1 || shared > 1+goroutines*each/50 {
		t.Fatalf("shared logged %d times", shared)
	}
	if wl.Tracked() > 8 {
		t.Fatalf("Tracked = %d", wl.Tracked())
	}
}
