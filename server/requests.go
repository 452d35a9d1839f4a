package server

import (
	"fmt"
	"time"

	"github.com/kvtier/kvtier/offload"
)

// The request registry of a namespace: which requests are active, which
// session owns each, and the pins and reservations each holds, so that a
// client can release only its own and a dead or idle client's are released
// for it.

// request is the registry entry of an active request. It remembers the
// pins and reservations the request holds so that a client can release
// only its own: the primary's reference counts also carry cascade pins, and
// its pending slots also carry promotions, which a stray CompleteLoad or
// CompleteStore would otherwise release or commit (serving wrong bytes).
type request struct {
	ctx      *offload.ReqContext
	sess     *session // the owner; nil for in-process and internal requests
	owner    string   // the tenant that made it; "" for the admin
	id       string   // the client's id (ctx.ID is the manager-wide one)
	last     time.Time
	params   int64 // kv_transfer_params bytes held
	finished bool
	// expired marks a request finished by the idle timeout while its
	// live session still held pins or reservations.
	expired bool
	// internal marks the temporary request of a PutBlocks/GetBlocks call:
	// it reserves its id but answers to no client call.
	internal bool
	// pins counts PrepareLoad pins per key not yet released by
	// CompleteLoad.
	pins map[offload.Key]int32
	// reserved holds the keys PrepareStore reserved whose CompleteStore
	// has not arrived yet.
	reserved map[offload.Key]struct{}
}

// idle reports whether the request holds nothing: a finished request is
// dropped from the registry once idle, because vLLM lets completions
// arrive after the request finished (docs/semantics.md §4.7).
func (r *request) idle() bool { return len(r.pins) == 0 && len(r.reserved) == 0 }

// register adds r to the registry; the caller holds the mutex.
func (ns *Namespace) register(r *request) {
	r.last = time.Now()
	ns.reqs[r.ctx.ID] = r
	if r.sess != nil {
		m := ns.bySession[r.sess]
		if m == nil {
			m = make(map[*request]struct{})
			ns.bySession[r.sess] = m
		}
		m[r] = struct{}{}
		r.sess.paramBytes.Add(r.params)
	}
	ns.paramTotal.Add(r.params)
}

// unregister removes r from the registry; the caller holds the mutex.
func (ns *Namespace) unregister(r *request) {
	if ns.reqs[r.ctx.ID] != r {
		return
	}
	delete(ns.reqs, r.ctx.ID)
	if r.owner != "" {
		if ns.byOwner[r.owner]--; ns.byOwner[r.owner] <= 0 {
			delete(ns.byOwner, r.owner)
		}
	}
	if r.sess != nil {
		if m := ns.bySession[r.sess]; m != nil {
			delete(m, r)
			if len(m) == 0 {
				delete(ns.bySession, r.sess)
			}
		}
		r.sess.paramBytes.Add(-r.params)
	}
	ns.paramTotal.Add(-r.params)
}

// release ends r for good, as if its client had completed and finished
// it: its pins are dropped, its reservations abandoned (their slots freed,
// nothing cascaded) and the manager is told it finished. The caller holds
// the mutex.
func (ns *Namespace) release(r *request) {
	for k, n := range r.pins {
		keys := make([]offload.Key, n)
		for i := range keys {
			keys[i] = k
		}
		if err := ns.mgr.CompleteLoad(keys, r.ctx); err != nil {
			ns.log.Error("release: unpin", "req", r.ctx.ID, "key", k, "err", err)
		}
	}
	if len(r.reserved) > 0 {
		keys := make([]offload.Key, 0, len(r.reserved))
		for k := range r.reserved {
			keys = append(keys, k)
		}
		if err := ns.mgr.CompleteStore(keys, r.ctx, false); err != nil {
			ns.log.Debug("release: abandon reservations", "req", r.ctx.ID, "err", err)
		}
	}
	r.pins, r.reserved = nil, nil
	if !r.finished {
		r.finished = true
		ns.mgr.OnRequestFinished(r.ctx)
	}
	ns.unregister(r)
}

// releaseSession releases every request s owns and returns how many.
func (ns *Namespace) releaseSession(s *session) int {
	ns.mu.Lock()
	defer ns.mu.Unlock()
	ns.releaseLeases(s)
	m := ns.bySession[s]
	n := len(m) // release unregisters: m shrinks as we go
	for r := range m {
		ns.release(r)
	}
	ns.released += uint64(n)
	return n
}

// expireIdle ends the requests whose last call was before cutoff. A
// request that holds nothing, or whose session has ended, is released; one
// whose connected client still holds pins or reservations is finished
// (marked expired) and keeps them: the client may still be reading or
// writing those slots in the shared arena, and only its completions or the
// end of its session make them safe to reuse.
func (ns *Namespace) expireIdle(cutoff time.Time) {
	if err := ns.lock(); err != nil {
		return
	}
	defer ns.mu.Unlock()
	n := 0
	for _, r := range ns.reqs {
		if r.internal || !r.last.Before(cutoff) {
			continue
		}
		if r.sess == nil || r.sess.closed.Load() || r.idle() {
			ns.release(r)
			n++
			continue
		}
		// The client is still connected and holds slots it may yet read
		// or write through the shared arena: freeing them now could let
		// a late write land in a block someone else stored. Finish the
		// request (its tiers drop their state) and leave the holds to
		// the client's completions or the end of its session.
		if !r.finished {
			r.finished, r.expired = true, true
			ns.mgr.OnRequestFinished(r.ctx)
			n++
		}
	}
	if n > 0 {
		ns.expired += uint64(n)
		ns.log.Warn("released requests that made no call for the request idle timeout (a client that forgot to finish them, or died holding them)",
			"requests", n, "idle_timeout", ns.limits.RequestIdleTimeout)
	}
}

// req returns the active request id of session s; the caller holds the
// mutex.
func (ns *Namespace) req(s *session, id string) (*request, error) {
	r, ok := ns.reqs[s.scope(id)]
	if !ok || r.internal || r.sess != s {
		return nil, fmt.Errorf("%w %q in namespace %q (call NewRequest first, on the same connection)", ErrUnknownRequest, id, ns.name)
	}
	r.last = time.Now()
	return r, nil
}

// liveReq returns active request id for a call that starts work for it
// (lookups, loads, stores); the caller holds the mutex. A finished
// request may only complete what it started: the manager has told the
// tiers it finished, so state they built for it now would never be
// dropped.
func (ns *Namespace) liveReq(s *session, id, what string) (*request, error) {
	r, err := ns.req(s, id)
	if err != nil {
		return nil, err
	}
	if r.expired {
		return nil, fmt.Errorf("%w: %s for request %q, which expired after %v without a call (limits.request_idle_timeout); its pins and reservations stay until completed or the connection closes", ErrProtocol, what, id, ns.limits.RequestIdleTimeout)
	}
	if r.finished {
		return nil, fmt.Errorf("%w: %s for finished request %q", ErrProtocol, what, id)
	}
	return r, nil
}

// lockReq locks the namespace and returns request id; on error the mutex
// is not held.
func (ns *Namespace) lockReq(s *session, id string) (*request, error) {
	if err := ns.lock(); err != nil {
		return nil, err
	}
	r, err := ns.req(s, id)
	if err != nil {
		ns.mu.Unlock()
		return nil, err
	}
	return r, nil
}

// lockLive is lockReq for a call that starts work for the request (see
// liveReq).
func (ns *Namespace) lockLive(s *session, id, what string) (*request, error) {
	if err := ns.lock(); err != nil {
		return nil, err
	}
	r, err := ns.liveReq(s, id, what)
	if err != nil {
		ns.mu.Unlock()
		return nil, err
	}
	return r, nil
}
