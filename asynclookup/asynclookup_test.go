package asynclookup

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/kvtier/kvtier/offload"
)

// fakeStore is a BatchFunc backed by a set, recording every call.
type fakeStore struct {
	mu      sync.Mutex
	present map[offload.Key]bool
	calls   [][]offload.Key
	err     error
	gate    chan struct{} // when non-nil, each call waits for a receive
}

func newFakeStore(keys ...offload.Key) *fakeStore {
	f := &fakeStore{present: make(map[offload.Key]bool)}
	for _, k := range keys {
		f.present[k] = true
	}
	return f
}

func (f *fakeStore) batch(ctx context.Context, keys []offload.Key) ([]bool, error) {
	f.mu.Lock()
	gate := f.gate
	f.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, append([]offload.Key(nil), keys...))
	if f.err != nil {
		return nil, f.err
	}
	out := make([]bool, len(keys))
	for i, k := range keys {
		out[i] = f.present[k]
	}
	return out, nil
}

func (f *fakeStore) set(k offload.Key, v bool) {
	f.mu.Lock()
	f.present[k] = v
	f.mu.Unlock()
}

func (f *fakeStore) numCalls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.calls)
}

// settle waits until m has nothing queued or in flight.
func settle(t *testing.T, m *Manager) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for m.Pending() {
		if time.Now().After(deadline) {
			t.Fatal("lookups still pending after 5s")
		}
		time.Sleep(time.Millisecond)
	}
}

// step flushes and waits for the verdicts, like the end of an engine step.
func step(t *testing.T, m *Manager) {
	t.Helper()
	m.Flush()
	settle(t, m)
}

func key(s string) offload.Key { return offload.MakeKey([]byte(s), 0) }

func TestLookupRetryThenVerdict(t *testing.T) {
	k1, k2 := key("a"), key("b")
	f := newFakeStore(k1)
	m := New("t", f.batch, Options{})
	defer m.Close()

	if r := m.Lookup(k1, "r"); r != offload.Retry {
		t.Fatalf("first lookup k1 = %v, want RETRY", r)
	}
	if r := m.Lookup(k2, "r"); r != offload.Retry {
		t.Fatalf("first lookup k2 = %v, want RETRY", r)
	}
	if !m.Pending() {
		t.Fatal("Pending = false with queued keys")
	}
	// Before the flush nothing is checked and answers stay Retry.
	if r := m.Lookup(k1, "r"); r != offload.Retry {
		t.Fatalf("lookup before flush = %v, want RETRY", r)
	}
	step(t, m)
	if got := f.numCalls(); got != 1 {
		t.Fatalf("BatchFunc calls = %d, want 1 (one batch per step)", got)
	}
	if r := m.Lookup(k1, "r"); r != offload.Hit {
		t.Fatalf("k1 = %v, want HIT", r)
	}
	if r := m.Lookup(k2, "r"); r != offload.Miss {
		t.Fatalf("k2 = %v, want MISS", r)
	}
	// Another request shares the verdict without probing.
	if r := m.Lookup(k1, "other"); r != offload.Hit {
		t.Fatalf("k1 for another request = %v, want HIT", r)
	}
	if m.Pending() {
		t.Fatal("Pending = true after verdicts landed")
	}
}

func TestFlushBatching(t *testing.T) {
	f := newFakeStore()
	m := New("t", f.batch, Options{MaxBatch: 3})
	defer m.Close()
	for i := range 7 {
		m.Lookup(key(string(rune('a'+i))), "r")
	}
	m.Lookup(key("a"), "r2") // already queued: not queued twice
	step(t, m)
	f.mu.Lock()
	sizes := []int{}
	total := 0
	for _, c := range f.calls {
		sizes = append(sizes, len(c))
		total += len(c)
	}
	f.mu.Unlock()
	if total != 7 || len(sizes) != 3 || sizes[0] != 3 || sizes[1] != 3 || sizes[2] != 1 {
		t.Fatalf("chunk sizes = %v (total %d), want [3 3 1]", sizes, total)
	}
	// A step with nothing queued posts nothing.
	step(t, m)
	if got := f.numCalls(); got != 3 {
		t.Fatalf("calls after empty flush = %d, want 3", got)
	}
}

func TestBatchErrorIsMiss(t *testing.T) {
	k := key("a")
	f := newFakeStore(k)
	f.err = errors.New("boom")
	m := New("t", f.batch, Options{})
	defer m.Close()
	m.Lookup(k, "r")
	step(t, m)
	if r := m.Lookup(k, "r"); r != offload.Miss {
		t.Fatalf("lookup after failing batch = %v, want MISS", r)
	}
}

func TestWrongLengthIsMiss(t *testing.T) {
	k := key("a")
	m := New("t", func(context.Context, []offload.Key) ([]bool, error) { return []bool{true, true}, nil }, Options{})
	defer m.Close()
	m.Lookup(k, "r")
	step(t, m)
	if r := m.Lookup(k, "r"); r != offload.Miss {
		t.Fatalf("lookup after malformed batch = %v, want MISS", r)
	}
}

func TestTimeoutIsMiss(t *testing.T) {
	k := key("a")
	m := New("t", func(ctx context.Context, _ []offload.Key) ([]bool, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	}, Options{Timeout: 10 * time.Millisecond})
	defer m.Close()
	m.Lookup(k, "r")
	step(t, m)
	if r := m.Lookup(k, "r"); r != offload.Miss {
		t.Fatalf("lookup after timed-out batch = %v, want MISS", r)
	}
}

func TestMarkMiss(t *testing.T) {
	k := key("a")
	f := newFakeStore(k)
	m := New("t", f.batch, Options{})
	defer m.Close()
	m.Lookup(k, "r1")
	step(t, m)
	if r := m.Lookup(k, "r1"); r != offload.Hit {
		t.Fatalf("before MarkMiss = %v, want HIT", r)
	}
	m.MarkMiss([]offload.Key{k})
	calls := f.numCalls()
	for range 3 { // no re-probe loop for the failing request
		if r := m.Lookup(k, "r1"); r != offload.Miss {
			t.Fatalf("after MarkMiss = %v, want MISS", r)
		}
		step(t, m)
	}
	if got := f.numCalls(); got != calls {
		t.Fatalf("request that failed a load re-probed: calls %d → %d", calls, got)
	}
	// A fresh request probes again and sees the store's answer.
	if r := m.Lookup(k, "r2"); r != offload.Retry {
		t.Fatalf("fresh request first lookup = %v, want RETRY", r)
	}
	step(t, m)
	if r := m.Lookup(k, "r2"); r != offload.Hit {
		t.Fatalf("fresh request = %v, want HIT", r)
	}
	if r := m.Lookup(k, "r1"); r != offload.Miss {
		t.Fatalf("failed request after fresh probe = %v, want MISS", r)
	}
	// Once the failed request finishes, its record goes.
	m.Cleanup("r1")
	if r := m.Lookup(k, "r1"); r != offload.Hit {
		t.Fatalf("reused request id after Cleanup = %v, want HIT (shared verdict)", r)
	}
}

func TestGenerationDiscardsStaleVerdict(t *testing.T) {
	k := key("a")
	f := newFakeStore(k)
	f.gate = make(chan struct{})
	m := New("t", f.batch, Options{})
	defer m.Close()

	m.Lookup(k, "r")
	m.Flush() // in flight, blocked on the gate
	// The key is forgotten and looked up again: a new generation.
	m.Forget([]offload.Key{k})
	f.set(k, false)
	if r := m.Lookup(k, "r"); r != offload.Retry {
		t.Fatalf("lookup of recreated key = %v, want RETRY", r)
	}
	f.gate <- struct{}{} // the stale batch answers "exists"
	// The stale verdict must not resolve the new generation. Wait until it
	// has been applied (nothing in flight), not for some time, so that the
	// check below cannot pass merely because the verdict is late.
	deadline := time.Now().Add(5 * time.Second)
	for {
		m.mu.Lock()
		applied := m.inflight == 0
		m.mu.Unlock()
		if applied {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("stale batch never applied")
		}
		time.Sleep(time.Millisecond)
	}
	if r := m.Lookup(k, "r"); r != offload.Retry {
		t.Fatalf("after stale verdict = %v, want RETRY", r)
	}
	f.mu.Lock()
	f.gate = nil
	f.mu.Unlock()
	step(t, m)
	if r := m.Lookup(k, "r"); r != offload.Miss {
		t.Fatalf("after fresh verdict = %v, want MISS", r)
	}
}

func TestCleanup(t *testing.T) {
	k1, k2 := key("a"), key("b")
	f := newFakeStore(k1, k2)
	m := New("t", f.batch, Options{})
	defer m.Close()

	// A queued key whose only request finishes is never probed.
	m.Lookup(k1, "r1")
	m.Cleanup("r1")
	step(t, m)
	if got := f.numCalls(); got != 0 {
		t.Fatalf("probe after cleanup of the only request: %d calls", got)
	}

	// A resolved key shared by two requests survives one cleanup.
	m.Lookup(k2, "r1")
	m.Lookup(k2, "r2")
	step(t, m)
	m.Cleanup("r1")
	if r := m.Lookup(k2, "r2"); r != offload.Hit {
		t.Fatalf("shared key after one cleanup = %v, want HIT", r)
	}
	m.Cleanup("r2")
	if n := len(m.keys); n != 0 {
		t.Fatalf("%d key states left after all requests finished", n)
	}
	if n := len(m.reqs); n != 0 {
		t.Fatalf("%d request states left after all requests finished", n)
	}
	// Probed afresh for a later request.
	f.set(k2, false)
	if r := m.Lookup(k2, "r3"); r != offload.Retry {
		t.Fatalf("later request = %v, want RETRY", r)
	}
	step(t, m)
	if r := m.Lookup(k2, "r3"); r != offload.Miss {
		t.Fatalf("later request verdict = %v, want MISS", r)
	}
}

func TestCleanupWhileInFlight(t *testing.T) {
	k := key("a")
	f := newFakeStore(k)
	f.gate = make(chan struct{})
	m := New("t", f.batch, Options{})
	defer m.Close()
	m.Lookup(k, "r")
	m.Flush()
	m.Cleanup("r")
	f.gate <- struct{}{}
	settle(t, m)
	m.mu.Lock()
	n := len(m.keys)
	m.mu.Unlock()
	if n != 0 {
		t.Fatalf("verdict for a key with no requests was kept (%d states)", n)
	}
}

func TestCloseStopsWorker(t *testing.T) {
	k := key("a")
	f := newFakeStore(k)
	f.gate = make(chan struct{}) // never opened: Close must cancel the call
	m := New("t", f.batch, Options{})
	m.Lookup(k, "r")
	m.Flush()
	done := make(chan struct{})
	go func() { m.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Close blocked on an in-flight batch")
	}
	if m.Pending() {
		t.Fatal("Pending after Close")
	}
	if r := m.Lookup(k, "r"); r != offload.Miss {
		t.Fatalf("lookup after Close = %v, want MISS", r)
	}
	m.Flush()
	m.Close() // idempotent
}

func BenchmarkBatch1000(b *testing.B) {
	keys := make([]offload.Key, 1000)
	for i := range keys {
		keys[i] = offload.MakeKey([]byte{byte(i), byte(i >> 8), 1, 2, 3, 4, 5, 6}, 0)
	}
	f := newFakeStore(keys...)
	m := New("bench", f.batch, Options{})
	defer m.Close()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		req := "req"
		for _, k := range keys {
			m.Lookup(k, req)
		}
		m.Flush()
		for m.Pending() {
			time.Sleep(time.Microsecond)
		}
		for _, k := range keys {
			if m.Lookup(k, req) != offload.Hit {
				b.Fatal("miss")
			}
		}
		m.Cleanup(req)
	}
}
