package asynclookup

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/kvtier/kvtier/offload"
)

// BatchFunc checks existence of keys; it runs on the manager's worker
// goroutine. It returns one verdict per key, co-indexed with keys. An error
// (or a result of the wrong length) makes every key of the call a miss.
type BatchFunc func(ctx context.Context, keys []offload.Key) ([]bool, error)

// Options tune a Manager. The zero value is usable.
type Options struct {
	// MaxBatch bounds the number of keys passed to one BatchFunc call; a
	// larger step batch is split. 0 means no limit.
	MaxBatch int
	// Timeout bounds one BatchFunc call (its context expires after it).
	// 0 means no timeout.
	Timeout time.Duration
	// Logger receives batch failures. nil means slog.Default().
	Logger *slog.Logger
}

type phase uint8

const (
	pending  phase = iota // queued for this step's batch
	inFlight              // posted to the worker
	resolved              // verdict known
)

// keyState is the shared lookup state of one key.
type keyState struct {
	gen    uint64
	phase  phase
	exists bool
	// reqs lists the requests that asked about the key; usually one, so
	// a slice over inline storage beats a map.
	reqs   []string
	inline [1]string
}

func (s *keyState) addReq(id string) bool {
	for _, r := range s.reqs {
		if r == id {
			return false
		}
	}
	s.reqs = append(s.reqs, id)
	return true
}

func (s *keyState) removeReq(id string) {
	for i, r := range s.reqs {
		if r == id {
			last := len(s.reqs) - 1
			s.reqs[i] = s.reqs[last]
			s.reqs[last] = ""
			s.reqs = s.reqs[:last]
			return
		}
	}
}

// reqState is the reverse index of one request.
type reqState struct {
	keys   map[offload.Key]struct{}
	missed map[offload.Key]struct{} // failed loads: Miss without probing
}

// probe is one key of a batch with the generation it was queued under.
type probe struct {
	key offload.Key
	gen uint64
}

// Manager batches asynchronous existence checks for one tier.
type Manager struct {
	name   string
	batch  BatchFunc
	opts   Options
	logger *slog.Logger

	ctx    context.Context // canceled by Close; parent of every BatchFunc call
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	work     chan struct{} // capacity 1: wakes the worker
	posted   [][]probe     // batches posted by Flush, not yet taken by the worker
	keys     map[offload.Key]*keyState
	reqs     map[string]*reqState
	queued   []probe // this step's pending keys
	inflight int     // keys posted or being checked
	gen      uint64
	closed   bool
}

// New starts a manager whose worker calls batch. name identifies the tier
// in log lines.
func New(name string, batch BatchFunc, opts Options) *Manager {
	logger := opts.Logger
	if logger == nil {
		logger = slog.Default()
	}
	ctx, cancel := context.WithCancel(context.Background())
	m := &Manager{
		name:   name,
		batch:  batch,
		opts:   opts,
		logger: logger,
		ctx:    ctx,
		cancel: cancel,
		work:   make(chan struct{}, 1),
		keys:   make(map[offload.Key]*keyState),
		reqs:   make(map[string]*reqState),
	}
	m.wg.Add(1)
	go m.run()
	return m
}

// Lookup answers Hit or Miss when the verdict for key is known, and Retry
// while the existence check is queued or in flight. It never blocks on
// I/O. reqID ties the key to a request so that Cleanup can forget it.
// After Close every lookup is a Miss.
func (m *Manager) Lookup(key offload.Key, reqID string) offload.LookupResult {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return offload.Miss
	}
	rs := m.reqs[reqID]
	if rs != nil {
		if _, ok := rs.missed[key]; ok {
			return offload.Miss
		}
	}
	st := m.keys[key]
	if st == nil {
		m.gen++
		st = &keyState{gen: m.gen, phase: pending}
		st.reqs = st.inline[:0]
		m.keys[key] = st
		m.queued = append(m.queued, probe{key: key, gen: st.gen})
	}
	if st.addReq(reqID) {
		if rs == nil {
			rs = &reqState{keys: make(map[offload.Key]struct{})}
			m.reqs[reqID] = rs
		}
		rs.keys[key] = struct{}{}
	}
	if st.phase != resolved {
		return offload.Retry
	}
	if st.exists {
		return offload.Hit
	}
	return offload.Miss
}

// Flush posts the keys queued since the previous Flush to the worker as
// one batch. Call it from the tier's OnScheduleEnd, once per step.
func (m *Manager) Flush() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed || len(m.queued) == 0 {
		return
	}
	batch := m.queued[:0:0]
	for _, p := range m.queued {
		st := m.keys[p.key]
		if st == nil || st.gen != p.gen || st.phase != pending {
			continue // dropped by Cleanup, Forget or MarkMiss since
		}
		st.phase = inFlight
		batch = append(batch, p)
	}
	m.queued = m.queued[:0]
	if len(batch) == 0 {
		return
	}
	m.inflight += len(batch)
	m.posted = append(m.posted, batch)
	select {
	case m.work <- struct{}{}:
	default: // the worker is already awake
	}
}

// MarkMiss records that loading keys failed: every request that currently
// references a key answers Miss for it until it finishes, without probing
// again, and the shared verdict is dropped so that other requests probe
// afresh.
func (m *Manager) MarkMiss(keys []offload.Key) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, k := range keys {
		st := m.keys[k]
		if st == nil {
			continue
		}
		for _, id := range st.reqs {
			rs := m.reqs[id]
			if rs == nil {
				continue
			}
			if rs.missed == nil {
				rs.missed = make(map[offload.Key]struct{})
			}
			rs.missed[k] = struct{}{}
		}
		delete(m.keys, k)
	}
}

// Forget drops the cached verdicts of keys (for example after the tier
// stored them), so that the next lookup probes again. Misses recorded by
// MarkMiss for running requests are kept: a request that failed to load a
// key does not retry it.
func (m *Manager) Forget(keys []offload.Key) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, k := range keys {
		delete(m.keys, k)
	}
}

// Cleanup forgets request reqID: its MarkMiss records go, and keys no
// other request references are dropped unless their check is in flight
// (those go when the verdict arrives).
func (m *Manager) Cleanup(reqID string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	rs := m.reqs[reqID]
	if rs == nil {
		return
	}
	delete(m.reqs, reqID)
	for k := range rs.keys {
		st := m.keys[k]
		if st == nil {
			continue
		}
		st.removeReq(reqID)
		if len(st.reqs) == 0 && st.phase != inFlight {
			delete(m.keys, k)
		}
	}
}

// Pending reports keys queued for the next Flush or checks in flight; the
// tier's HasPendingWork includes it so the engine keeps stepping until
// the verdicts land.
func (m *Manager) Pending() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return false
	}
	return len(m.queued) > 0 || m.inflight > 0
}

// Close stops the worker, cancelling a BatchFunc call in progress, and
// waits for it to exit. Verdicts still in flight are discarded. Close is
// idempotent.
func (m *Manager) Close() {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return
	}
	m.closed = true
	m.queued = nil
	m.posted = nil
	m.inflight = 0
	m.keys = make(map[offload.Key]*keyState)
	m.reqs = make(map[string]*reqState)
	m.mu.Unlock()
	m.cancel()
	m.wg.Wait()
}

// run is the worker goroutine: it takes posted batches in order and checks
// them chunk by chunk.
func (m *Manager) run() {
	defer m.wg.Done()
	for {
		select {
		case <-m.ctx.Done():
			return
		case <-m.work:
		}
		for {
			m.mu.Lock()
			if m.closed || len(m.posted) == 0 {
				m.mu.Unlock()
				break
			}
			batch := m.posted[0]
			m.posted[0] = nil
			m.posted = m.posted[1:]
			m.mu.Unlock()
			m.check(batch)
		}
	}
}

// check runs BatchFunc over one posted batch and applies the verdicts.
func (m *Manager) check(batch []probe) {
	chunk := m.opts.MaxBatch
	if chunk <= 0 || chunk > len(batch) {
		chunk = len(batch)
	}
	keys := make([]offload.Key, 0, chunk)
	for start := 0; start < len(batch); start += chunk {
		end := min(start+chunk, len(batch))
		part := batch[start:end]
		keys = keys[:0]
		for _, p := range part {
			keys = append(keys, p.key)
		}
		found, err := m.call(keys)
		if err != nil {
			if m.ctx.Err() == nil {
				m.logger.Warn("batch_lookup failed", "tier", m.name, "keys", len(keys), "err", err)
			}
			found = nil
		}
		m.apply(part, found)
	}
}

// call runs BatchFunc with the manager's context and timeout, turning a
// panic-free but malformed answer into an error.
func (m *Manager) call(keys []offload.Key) ([]bool, error) {
	ctx := m.ctx
	if m.opts.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, m.opts.Timeout)
		defer cancel()
	}
	found, err := m.batch(ctx, keys)
	if err != nil {
		return nil, fmt.Errorf("asynclookup %s: batch of %d keys: %w", m.name, len(keys), err)
	}
	if len(found) != len(keys) {
		return nil, fmt.Errorf("asynclookup %s: batch of %d keys returned %d verdicts", m.name, len(keys), len(found))
	}
	return found, nil
}

// apply records verdicts (nil found means all misses) for keys whose
// generation still matches.
func (m *Manager) apply(part []probe, found []bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return
	}
	m.inflight -= len(part)
	for i, p := range part {
		st := m.keys[p.key]
		if st == nil || st.gen != p.gen {
			continue
		}
		if len(st.reqs) == 0 {
			delete(m.keys, p.key)
			continue
		}
		st.phase = resolved
		st.exists = found != nil && found[i]
	}
}
