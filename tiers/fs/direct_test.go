package fs

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/kvtier/kvtier/offload"
	"github.com/kvtier/kvtier/vfs"
	"github.com/kvtier/kvtier/vfs/vfstest"
)

func TestODirectProbe(t *testing.T) {
	tier := newTier(t, t.TempDir(), nil)
	t.Logf("O_DIRECT on %s: %v", t.TempDir(), tier.Direct())
	off := newTier(t, t.TempDir(), func(c *Config) { c.ODirect = "off" })
	if off.Direct() {
		t.Fatal("o_direct: off used O_DIRECT")
	}
	if tier.Direct() {
		// "on" must then start as well.
		newTier(t, t.TempDir(), func(c *Config) { c.ODirect = "on" })
	} else if _, err := New(testConfig(t.TempDir(), func(c *Config) { c.ODirect = "on" })); err == nil {
		t.Fatal("o_direct: on started without O_DIRECT support")
	}
}

// syncBuffer is a bytes.Buffer safe for the tier's goroutines to log into.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// A filesystem that refuses O_DIRECT (the probe's aligned write fails, as
// on tmpfs) makes o_direct: auto fall back to buffered I/O with exactly
// one log line, however many blocks go through afterwards; o_direct: on
// refuses to start instead.
func TestODirectFallbackLogsOnce(t *testing.T) {
	refuse := func() vfs.FS {
		return vfstest.NewInjector(vfs.OS(), vfstest.On(vfstest.OpCreate, ".odirect-probe", vfstest.Fault{Err: syscall.EINVAL}))
	}
	var logs syncBuffer
	tier := newTier(t, t.TempDir(), func(c *Config) {
		c.FS = refuse()
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	})
	if tier.Direct() {
		t.Fatal("O_DIRECT in use although the probe failed")
	}
	a := newArena(bs, 8, true)
	keys := []offload.Key{k(1), k(2), k(3), k(4)}
	if res := run(t, tier, false, a, req("w"), keys, []int64{0, 1, 2, 3}); !res.Success {
		t.Fatalf("buffered store: %+v", res)
	}
	if res := run(t, tier, true, a, req("r"), keys, []int64{4, 5, 6, 7}); !res.Success {
		t.Fatalf("buffered load: %+v", res)
	}
	for i := range keys {
		if !bytes.Equal(a.slot(int64(i)), a.slot(int64(4+i))) {
			t.Fatalf("block %d differs after a buffered round trip", i)
		}
	}
	var direct []string
	for line := range strings.SplitSeq(strings.TrimSpace(logs.String()), "\n") {
		if strings.Contains(line, "O_DIRECT") {
			direct = append(direct, line)
		}
	}
	if len(direct) != 1 || !strings.Contains(direct[0], "invalid argument") {
		t.Fatalf("O_DIRECT log lines %q, want exactly one naming the probe's error", direct)
	}
	_, err := New(testConfig(t.TempDir(), func(c *Config) { c.FS, c.ODirect = refuse(), "on" }))
	if err == nil || !strings.Contains(err.Error(), "o_direct") {
		t.Fatalf("o_direct: on with a failing probe: %v, want a start-up error", err)
	}
}
