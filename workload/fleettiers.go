package workload

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/kvtier/kvtier/cpu"
	"github.com/kvtier/kvtier/offload"
)

// The two tiers a fleet replay adds to every node's stack. Both are
// models for the simulation, in-process and synchronous (a job's result is
// ready when it is submitted): the shared remote store stands for the
// fleet's Redis Cluster, the peer tier for the other nodes' daemons.

// errGone is the failure of a load whose block left the tier between the
// lookup and the load: a miss for the request, as in every tier.
var errGone = errors.New("block gone since the lookup")

// syncTier holds what the model tiers have in common: results ready at
// submission, no lookups in flight, no events.
type syncTier struct {
	name, typ string
	mu        sync.Mutex
	results   []offload.JobResult
}

func (t *syncTier) Name() string                                           { return t.name }
func (t *syncTier) Type() string                                           { return t.typ }
func (t *syncTier) Medium() offload.Medium                                 { return offload.MediumCPU }
func (t *syncTier) Locality() offload.Locality                             { return offload.LocalityRemote }
func (t *syncTier) DrainJobs(context.Context) error                        { return nil }
func (t *syncTier) HasPendingWork() bool                                   { return false }
func (t *syncTier) OnNewRequest(*offload.ReqContext) offload.OffloadPolicy { return offload.BlockLevel }
func (t *syncTier) OnRequestFinished(*offload.ReqContext)                  {}
func (t *syncTier) OnScheduleEnd(offload.ScheduleEnd)                      {}
func (t *syncTier) TakeEvents() []offload.Event                            { return nil }
func (t *syncTier) Close(context.Context) error                            { return nil }

func (t *syncTier) FinishedJobs() []offload.JobResult {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := t.results
	t.results = nil
	return out
}

func (t *syncTier) finish(job *offload.Job, done int, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.results = append(t.results, offload.JobResult{
		JobID: job.ID, Success: err == nil, SuccessfulKeys: job.Keys[:done],
		Bytes: int64(done) * int64(job.Arena.SlotSize()), Err: err,
	})
}

// sharedStore is one remote store of a fixed number of blocks, LRU, that
// every node of the fleet reads and writes.
type sharedStore struct {
	mu     sync.Mutex
	cap    int
	blocks map[offload.Key]*list.Element // of *sharedBlock
	lru    list.List                     // front = most recent
}

type sharedBlock struct {
	key  offload.Key
	data []byte
}

func newSharedStore(capacity int) *sharedStore {
	return &sharedStore{cap: capacity, blocks: make(map[offload.Key]*list.Element)}
}

// sharedView is one node's client of the shared store.
type sharedView struct {
	syncTier
	s *sharedStore
}

func newSharedView(s *sharedStore) *sharedView {
	return &sharedView{syncTier: syncTier{name: "shared", typ: "shared"}, s: s}
}

func (v *sharedView) Lookup(k offload.Key, _ *offload.ReqContext) offload.LookupResult {
	v.s.mu.Lock()
	defer v.s.mu.Unlock()
	if _, ok := v.s.blocks[k]; ok {
		return offload.Hit
	}
	return offload.Miss
}

func (v *sharedView) SubmitStore(job *offload.Job) {
	done, err := v.s.store(job)
	v.finish(job, done, err)
}

func (v *sharedView) SubmitLoad(job *offload.Job) {
	done, err := v.s.load(job)
	v.finish(job, done, err)
}

// store copies job's blocks in, evicting the least recently used beyond
// the capacity, and returns how many it stored.
func (s *sharedStore) store(job *offload.Job) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, k := range job.Keys {
		src, err := job.Arena.Slot(job.Slots[i])
		if err != nil {
			return i, err
		}
		if e, ok := s.blocks[k]; ok {
			s.lru.MoveToFront(e)
			continue
		}
		b := &sharedBlock{key: k}
		if s.lru.Len() >= s.cap {
			old := s.lru.Back()
			b = old.Value.(*sharedBlock) // reuse its buffer
			delete(s.blocks, b.key)
			s.lru.Remove(old)
			b.key = k
		}
		b.data = append(b.data[:0], src...)
		s.blocks[k] = s.lru.PushFront(b)
	}
	return len(job.Keys), nil
}

// load copies job's blocks out and returns how many it loaded; a block
// evicted since the lookup ends the job there.
func (s *sharedStore) load(job *offload.Job) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, k := range job.Keys {
		e, ok := s.blocks[k]
		if !ok {
			return i, fmt.Errorf("shared %s: %w", k, errGone)
		}
		dst, err := job.Arena.Slot(job.Slots[i])
		if err != nil {
			return i, err
		}
		copy(dst, e.Value.(*sharedBlock).data)
		s.lru.MoveToFront(e)
	}
	return len(job.Keys), nil
}

func (v *sharedView) Touch(keys []offload.Key, _ *offload.ReqContext) {
	v.s.mu.Lock()
	defer v.s.mu.Unlock()
	for _, k := range keys {
		if e, ok := v.s.blocks[k]; ok {
			v.s.lru.MoveToFront(e)
		}
	}
}

// peerTier is one node's view of the other nodes' primaries: a lookup
// hits when another node holds the block in DRAM, a load copies it from
// there. Peers are read-only (no push): the manager sends it no cascades. It
// looks and copies on the replay's goroutine only (lookups and loads run
// there; the primaries are not safe for concurrent use), snapshotting a
// block at its lookup so that the load does not touch the peer again.
type peerTier struct {
	syncTier
	self  int
	peers *[]*cpu.Primary // every node's primary, set once the fleet is built
	snap  map[offload.Key][]byte
}

// maxPeerSnapshots bounds the blocks a peer tier keeps between a lookup
// and its load.
const maxPeerSnapshots = 1 << 14

func newPeerTier(self int, peers *[]*cpu.Primary) *peerTier {
	return &peerTier{syncTier: syncTier{name: "peer", typ: "peer"}, self: self, peers: peers, snap: make(map[offload.Key][]byte)}
}

func (t *peerTier) Lookup(k offload.Key, _ *offload.ReqContext) offload.LookupResult {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.snap[k]; ok {
		return offload.Hit
	}
	for j, p := range *t.peers {
		if j == t.self {
			continue
		}
		s, ok := p.SlotOf(k)
		if !ok {
			continue
		}
		if ref, _ := p.RefCount(k); ref < 0 {
			continue // its store is still in flight there
		}
		src, err := p.Arena().Slot(s)
		if err != nil {
			continue
		}
		if len(t.snap) >= maxPeerSnapshots {
			clear(t.snap)
		}
		t.snap[k] = append([]byte(nil), src...)
		return offload.Hit
	}
	return offload.Miss
}

func (t *peerTier) SubmitLoad(job *offload.Job) {
	t.mu.Lock()
	for i, k := range job.Keys {
		b, ok := t.snap[k]
		dst, err := job.Arena.Slot(job.Slots[i])
		if !ok || err != nil {
			t.mu.Unlock()
			if err == nil {
				err = fmt.Errorf("peer %s: %w", k, errGone)
			}
			t.finish(job, i, err)
			return
		}
		copy(dst, b)
		delete(t.snap, k)
	}
	t.mu.Unlock()
	t.finish(job, len(job.Keys), nil)
}

// ReadOnly keeps cascades away: peers do not push.
func (t *peerTier) ReadOnly() bool { return true }

// SubmitStore is never called for a read-only tier; a store that arrives
// anyway fails.
func (t *peerTier) SubmitStore(job *offload.Job) {
	t.finish(job, 0, errors.New("peer tier: read-only (no push)"))
}

func (t *peerTier) Touch([]offload.Key, *offload.ReqContext) {}
