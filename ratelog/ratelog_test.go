package ratelog

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestOneLinePerIntervalWithACount(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	now := time.Unix(1000, 0)
	l := &Limiter{Interval: time.Second, Now: func() time.Time { return now }}
	for i := range 100 {
		l.Warn(log, "refused", "connection refused", "i", i)
	}
	now = now.Add(time.Second)
	l.Warn(log, "refused", "connection refused", "i", 100)
	l.Warn(log, "other", "another kind")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("%d lines, want 3:\n%s", len(lines), buf.String())
	}
	if strings.Contains(lines[0], "suppressed") || !strings.Contains(lines[0], "i=0") {
		t.Errorf("first line %q", lines[0])
	}
	if !strings.Contains(lines[1], "i=100") || !strings.Contains(lines[1], "suppressed=99") {
		t.Errorf("line after the interval %q: want i=100 and suppressed=99", lines[1])
	}
	if !strings.Contains(lines[2], "another kind") {
		t.Errorf("another key is its own: %q", lines[2])
	}
}

func TestManyKeysStayBounded(t *testing.T) {
	var l Limiter
	log := slog.New(slog.DiscardHandler)
	for i := range 5000 {
		l.Warn(log, string(rune(i)), "x")
	}
	if n := len(l.keys); n > maxKeys {
		t.Fatalf("%d keys remembered, want at most %d", n, maxKeys)
	}
}
