package zmtp

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (w *lockedBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *lockedBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// A flood of connections beyond MaxConns is refused without flooding the
// log: one line for the burst, not one per connection.
func TestRefusalFloodLogsOnce(t *testing.T) {
	logs := &lockedBuffer{}
	p := NewPub(PubOptions{MaxConns: 1, HandshakeTimeout: time.Hour, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	defer p.Close(context.Background())
	p.refusals.Interval = time.Hour // the whole flood falls in one interval, however slow the machine
	addr, err := p.Bind("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	first, err := net.Dial("tcp", addr.String())
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	// The first connection counts once its handshake is under way.
	for {
		p.mu.Lock()
		n := len(p.pending)
		p.mu.Unlock()
		if n == 1 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	const flood = 60
	for range flood {
		c, err := net.Dial("tcp", addr.String())
		if err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
	for p.Refused() < flood {
		time.Sleep(time.Millisecond)
	}
	if n := strings.Count(logs.String(), "connection refused"); n != 1 {
		t.Fatalf("%d refusal lines for a flood of %d connections, want 1:\n%s", n, flood, logs.String())
	}
}
