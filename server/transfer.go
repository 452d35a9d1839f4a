package server

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/kvtier/kvtier/offload"
)

// The by-value calls: for clients that cannot map the arena.

// tempRequest registers a request for one PutBlocks/GetBlocks call; the
// caller holds the mutex and must call finishTemp.
//
// The temporary request is registered like a client's (the manager keys
// its state by id), so neither can take the other's id, even while
// GetBlocks waits with the mutex released.
func (ns *Namespace) tempRequest(params []byte) (*offload.ReqContext, error) {
	var id string
	for {
		ns.ephemeral++
		id = "kvtier-internal-" + strconv.FormatUint(ns.ephemeral, 10)
		if _, taken := ns.reqs[id]; !taken {
			break
		}
	}
	rc, err := ns.parser.NewReqContext(id, params)
	if err != nil {
		return nil, err
	}
	ns.mgr.OnNewRequest(rc)
	ns.register(&request{ctx: rc, internal: true})
	return rc, nil
}

// PutBlocks stores blocks by value: PrepareStore, copy into the reserved
// slots, CompleteStore. With id == "" a temporary request built from
// params is used. metas is empty or co-indexed with keys (an entry with
// no block hashes: none for that block). statuses[i] is true when keys[i]
// was written, false when it was already present.
func (ns *Namespace) PutBlocks(s *session, id string, params []byte, keys []offload.Key, data [][]byte, metas []BlockMeta) (written []bool, evicted []offload.Key, err error) {
	if len(keys) != len(data) {
		return nil, nil, fmt.Errorf("%w: %d keys for %d blocks", ErrInvalidArgument, len(keys), len(data))
	}
	slotSize := ns.arena.SlotSize()
	index := make(map[offload.Key]int, len(keys))
	for i, k := range keys {
		if len(data[i]) != slotSize {
			return nil, nil, fmt.Errorf("%w: blocks[%d]: data is %d bytes, slot size is %d", ErrInvalidArgument, i, len(data[i]), slotSize)
		}
		if j, dup := index[k]; dup {
			return nil, nil, fmt.Errorf("%w: blocks[%d]: key %s repeats blocks[%d]", ErrInvalidArgument, i, k, j)
		}
		index[k] = i
	}
	if err := ns.checkParams(params); err != nil {
		return nil, nil, err
	}
	if err := ns.lock(); err != nil {
		return nil, nil, err
	}
	defer ns.mu.Unlock()
	rc, _, finish, err := ns.callRequestLocked(s, id, "put blocks", params)
	if err != nil {
		return nil, nil, err
	}
	defer finish()
	if err := ns.recordMetasLocked(keys, metas); err != nil {
		return nil, nil, err
	}

	out, ok, err := ns.mgr.PrepareStore(keys, rc)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: prepare store: %w", ErrProtocol, err)
	}
	if !ok {
		return nil, nil, ns.noSpace(len(keys))
	}
	written = make([]bool, len(keys))
	for i, k := range out.KeysToStore {
		dst, err := ns.arena.Slot(out.Slots[i])
		if err != nil {
			// Abandon the reservation: the slots go back to the free list.
			cerr := ns.mgr.CompleteStore(out.KeysToStore, rc, false)
			return nil, nil, errors.Join(fmt.Errorf("put %s: %w", k, err), cerr)
		}
		copy(dst, data[index[k]])
		written[index[k]] = true
	}
	if len(out.KeysToStore) > 0 {
		if err := ns.mgr.CompleteStore(out.KeysToStore, rc, true); err != nil {
			return nil, nil, fmt.Errorf("%w: complete store: %w", ErrProtocol, err)
		}
	}
	ns.publishLocked()
	return written, out.Evicted, nil
}

// callRequestLocked returns the context for a by-value call what: the
// active request id (r is its registry entry), or a temporary request
// (r is nil) finished by the returned func.
func (ns *Namespace) callRequestLocked(s *session, id, what string, params []byte) (rc *offload.ReqContext, r *request, finish func(), err error) {
	if id != "" {
		r, err := ns.liveReq(s, id, what)
		if err != nil {
			return nil, nil, nil, err
		}
		return r.ctx, r, func() {}, nil
	}
	rc, err = ns.tempRequest(params)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("temporary request: %w", err)
	}
	return rc, nil, func() {
		if r := ns.reqs[rc.ID]; r != nil {
			ns.unregister(r)
		}
		ns.mgr.OnRequestFinished(rc)
	}, nil
}

// GetBlocks loads blocks by value: pinGetLocked looks the keys up (and
// waits for promotions) and pins each hit as it is found; the blocks are
// then copied and unpinned. data[i] is set for results[i] == Hit (only
// within the leading hits with prefixOnly).
func (ns *Namespace) GetBlocks(ctx context.Context, s *session, id string, params []byte, keys []offload.Key, wait time.Duration, prefixOnly bool) (results []offload.LookupResult, data [][]byte, hits int, err error) {
	slotSize := ns.arena.SlotSize()
	if err := ns.checkGetSize(len(keys)); err != nil {
		return nil, nil, 0, err
	}
	g, err := ns.pinGetLocked(ctx, s, id, params, keys, wait, prefixOnly)
	if err != nil {
		return nil, nil, 0, err
	}
	defer ns.mu.Unlock()
	// Copied under the mutex: a request of the caller's session must not
	// finish while its blocks are pinned for it.
	data = make([][]byte, len(keys))
	var copyErr error
	for i, slot := range g.slots {
		if slot < 0 {
			continue
		}
		src, err := ns.arena.Slot(slot)
		if err != nil {
			copyErr = fmt.Errorf("get %s: %w", keys[i], err)
			break
		}
		data[i] = append(make([]byte, 0, slotSize), src...)
	}
	if err := errors.Join(copyErr, g.doneLocked()); err != nil {
		return nil, nil, 0, err
	}
	return g.results, data, g.hits, nil
}

// checkGetSize refuses a by-value read of n keys whose blocks may not fit
// one API message. GetBlocks on the block stream has the same bound,
// although it sends no such message: the two paths give the same answers,
// and a call never pins more of the primary than one message holds.
func (ns *Namespace) checkGetSize(n int) error {
	slotSize := ns.arena.SlotSize()
	// Leave 64 KiB for keys and framing.
	if max := (ns.limits.MaxMessageBytes - 64<<10) / slotSize; n > max {
		return fmt.Errorf("%w: GetBlocks of %d keys with %d-byte blocks may exceed the %d-byte message limit (at most %d keys per call)",
			ErrLimit, n, slotSize, ns.limits.MaxMessageBytes, max)
	}
	return nil
}

// pinnedGet is a by-value read whose blocks are pinned: slots[i] is the
// slot of keys[i] to return, -1 for a key not returned.
type pinnedGet struct {
	ns      *Namespace
	rc      *offload.ReqContext
	results []offload.LookupResult
	hits    int
	slots   []int64
	load    []offload.Key
	finish  func()
}

// pinGetLocked is the first half of a by-value read (GetBlocks, and gets
// on the block stream). It looks every key up, pinning the blocks the call
// returns; while some key answers Retry or HitPending and the wait has not
// expired, it unpins, ends the step (ScheduleEnd), releases the mutex,
// sleeps briefly and looks up again. On success it returns with the mutex held; the
// caller reads the slots (with or without the mutex) and then calls
// doneLocked, with the mutex held, exactly once.
func (ns *Namespace) pinGetLocked(ctx context.Context, s *session, id string, params []byte, keys []offload.Key, wait time.Duration, prefixOnly bool) (*pinnedGet, error) {
	if err := ns.checkParams(params); err != nil {
		return nil, err
	}
	wait = min(max(wait, 0), ns.limits.MaxWait)
	deadline := time.Now().Add(wait)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}

	if err := ns.lock(); err != nil {
		return nil, err
	}
	rc, r, finish, err := ns.callRequestLocked(s, id, "get blocks", params)
	if err != nil {
		ns.mu.Unlock()
		return nil, err
	}
	g := &pinnedGet{ns: ns, rc: rc, results: make([]offload.LookupResult, len(keys)), slots: make([]int64, len(keys)), finish: finish}
	backoff := 100 * time.Microsecond
	for {
		if err := g.lookAndPinLocked(keys, prefixOnly); err != nil {
			finish()
			ns.mu.Unlock()
			return nil, err
		}
		if !anyInFlight(g.results) || !time.Now().Before(deadline) {
			return g, nil
		}
		// Not yet: unpin, end the step so that promotions are submitted
		// and finished jobs are processed by the next pass, and wait.
		if err := g.unpinLocked(); err != nil {
			finish()
			ns.mu.Unlock()
			return nil, err
		}
		ns.mgr.ScheduleEnd(offload.ScheduleEnd{})
		ns.publishLocked()
		ns.mu.Unlock()
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			// Relock only to finish the temporary request.
			if lerr := ns.lock(); lerr == nil {
				finish()
				ns.mu.Unlock()
			}
			return nil, ctx.Err()
		case <-t.C:
		}
		backoff = min(backoff*2, 5*time.Millisecond)
		if err := ns.lock(); err != nil {
			// Closed while waiting: Close finished every request.
			return nil, err
		}
		if r != nil && (ns.reqs[r.ctx.ID] != r || r.finished) {
			ns.mu.Unlock()
			return nil, fmt.Errorf("%w: request %q finished while get blocks waited", ErrProtocol, id)
		}
	}
}

// lookAndPinLocked is one pass over keys: each is looked up in turn and,
// when the call returns it, pinned at once — before the next key's lookup,
// which may start a promotion, and a promotion may evict a ready block
// (vLLM's lookup does the same): a block reported HIT is always loadable.
func (g *pinnedGet) lookAndPinLocked(keys []offload.Key, prefixOnly bool) error {
	g.hits = 0
	inPrefix := true
	for i, k := range keys {
		r := g.ns.mgr.Lookup(k, g.rc)
		g.results[i], g.slots[i] = r, -1
		if r != offload.Hit {
			inPrefix = false
		}
		if r == offload.Hit && (inPrefix || !prefixOnly) {
			s, err := g.ns.mgr.PrepareLoad([]offload.Key{k}, g.rc)
			if err != nil {
				return errors.Join(fmt.Errorf("%w: prepare load: %w", ErrProtocol, err), g.unpinLocked())
			}
			g.slots[i] = s[0]
			g.load = append(g.load, k)
		}
		if inPrefix {
			g.hits++
		}
	}
	return nil
}

// unpinLocked releases the pins of g.
func (g *pinnedGet) unpinLocked() error {
	load := g.load
	g.load = nil
	if len(load) == 0 {
		return nil
	}
	if err := g.ns.mgr.CompleteLoad(load, g.rc); err != nil {
		return fmt.Errorf("%w: complete load: %w", ErrProtocol, err)
	}
	return nil
}

// doneLocked unpins the blocks of g and finishes its temporary request.
func (g *pinnedGet) doneLocked() error {
	defer g.finish()
	if err := g.unpinLocked(); err != nil {
		return err
	}
	g.ns.publishLocked()
	return nil
}

func anyInFlight(results []offload.LookupResult) bool {
	for _, r := range results {
		if r == offload.Retry || r == offload.HitPending {
			return true
		}
	}
	return false
}

// noSpace is the error of a store the primary cannot make room for, with
// what holds the slots, so that a user can tell which client to look at.
func (ns *Namespace) noSpace(n int) error {
	msg := fmt.Sprintf("cannot make room for %d blocks", n)
	if ns.stats != nil {
		st := ns.stats()
		p := st.Primary
		msg += fmt.Sprintf(": of %d slots, %d are pinned by readers (%d of them by cascades in flight) and %d are being written; %d active requests hold pins or reservations",
			p.NumSlots, p.PinnedSlots, st.CascadePinned, p.PendingSlots, ns.holders())
	}
	return fmt.Errorf("%w: %s; retry later, and check for clients that store without ever ending a step (ScheduleEnd) or never complete their loads and stores", ErrNoSpace, msg)
}

// holders counts the requests holding pins or reservations; the caller
// holds the mutex.
func (ns *Namespace) holders() int {
	n := 0
	for _, r := range ns.reqs {
		if !r.idle() {
			n++
		}
	}
	return n
}
