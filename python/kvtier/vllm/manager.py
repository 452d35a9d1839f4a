"""KvtierProxyManager: vLLM's OffloadingManager, answered by a kvtier
daemon without a round trip per key or per request.

Everything the scheduler calls is answered locally:

* ``lookup`` answers from the result of the step's batched call. The first
  lookup of a request the daemon has not heard of makes one bounded call
  (the *first sight*): it announces the request and asks about all its
  keys from there on, which vLLM has recorded by then, so that the
  request's HITs, MISSes and promotions start in the step that asks; the
  calls of one step share a time budget (``first_sight_ms``). Other keys
  seen for the first time answer RETRY and join the next EngineStep. A HIT is
  a *lookup lease*: the daemon pinned the block for the request and sent
  its slot, so ``prepare_load`` returns the slot without asking, and no
  eviction can take the block first. A lease the request does not use
  within ``lease_steps`` steps (or by its finish) is released.
* ``prepare_store`` assigns slots from a pool of *slot leases* (free slots
  the daemon leased to this engine) and returns at once; the writes are
  bound to their keys with ``complete_store``, at the next step end. A
  store the pool is too small for makes the one call the scheduler thread
  waits on (EngineReserve, bounded): it leaves out the keys the daemon
  holds already and leases slots for the rest, so the store goes whole.
* completions, touches, finishes and new requests are batched into the
  step-end call, which also returns the step's events.

The step-end call runs on a thread of its own: ``on_schedule_end`` hands it
the step's batch and returns; its answer is applied at the next call of
the scheduler. One call is out at a time: steps that end while it is out
add their work to the next batch, which goes when the answer is in. The
scheduler thread waits on the daemon only for first sights (within the
step's budget) and for EngineReserve, on a store the pool is too small
for, each bounded by 100 ms (or lookup_timeout_s), and for neither again
after one fails until a step call has been answered. A first sight goes
ahead of the batch being built, so it is skipped while a cache reset is
pending, and its MISS for a block this engine stored but no step call has
bound yet is asked again with the batch.

The link to the daemon
----------------------

Everything the engine holds on the daemon — pins, leased slots, requests —
belongs to one *link*: one connection (a daemon session) attached to one
*epoch* of the namespace (a restarted daemon's namespace has another).
Links are numbered by generation. When a step call fails (the daemon died,
is unreachable, timed out, or forgot the namespace) the link is *down*:

* lookups answer MISS at once, and a lookup the daemon has not answered
  within ``lookup_timeout_s`` answers MISS too, so no request waits on the
  daemon longer than that bound;
* ``prepare_store`` answers None (vLLM keeps the blocks on the GPU and
  counts an allocation failure);
* loads and stores already handed to the workers finish against the
  mapping they were prepared for: the arena's memory outlives the daemon
  while a worker maps it, and a lookup lease's bytes are never rewritten
  (vLLM 0.33 has no way to fail a transfer: its connector asserts every
  job's success).

The sending thread reattaches every ``reconnect_interval_s`` on a new
connection, so the daemon sees a new session. At the next step boundary the
scheduler switches to the new link: every request is announced again, the
store pool is rebuilt, and every slot of the old link is forgotten; jobs of
the old link still in flight are *stale* and are never committed to the new
one. The old connection stays open until its stale jobs have completed, so
that a daemon that was only slow keeps their pins and slots reserved while
a worker may still touch them. Every slot handed to a worker carries its
epoch (``KvtierSlotSpec``); the worker maps that epoch's arena before the
first transfer that names it and never touches the old mapping again
(``kvtier.vllm.spec.ArenaWorker``).

Switches happen only between steps (at ``on_schedule_end`` or at the first
call of a step): within a step, a lookup HIT and the ``prepare_load`` that
follows it always see the same link.
"""

from __future__ import annotations

import json
import logging
import queue
import time
from collections import deque
from typing import TYPE_CHECKING, Collection, Iterable

from kvtier import _daemon
from kvtier.vllm import _compat as vc
from kvtier.vllm import _steps
from kvtier.vllm._calls import BoundedCalls
from kvtier.vllm._mstate import _CALL_BOUND, _HELD_STEPS, _MAX_FREE, _MISS, _RETRY, Batch, KvtierSlotSpec, Req

if TYPE_CHECKING:
    from kvtier.client import Client
    from kvtier.vllm.spec import KvtierOffloadingSpec

log = logging.getLogger("kvtier.vllm")

__all__ = ["KvtierProxyManager", "KvtierSlotSpec"]


class KvtierProxyManager(BoundedCalls, vc.OffloadingManager):
    def __init__(self, spec: KvtierOffloadingSpec) -> None:
        from kvtier.v1 import kvtier_pb2 as pb

        self._pb = pb
        self._spec = spec
        self._lease_steps = spec._lease_steps
        # Leased store slots hold no block: the pool is room the cache
        # does not use, so it follows the stores of one step (the step end
        # refills it) and stays within a quarter of the primary, which
        # other engines may share.
        self._max_free = max(spec.num_chunks // 4, 1)
        # For a store larger than that, EngineReserve may lease up to three
        # quarters of the primary: its new blocks evict that much anyway,
        # and the blocks the daemon holds are not among them.
        self._max_burst = max(min(spec.num_chunks * 3 // 4, _MAX_FREE), self._max_free)
        # The bound on the calls the scheduler thread waits for (first
        # sights, reserves). After a reserve fails none is made until a step
        # answer comes back (the daemon is slow or gone: the store keeps
        # what the pool holds, as before).
        self._call_bound = min(spec._lookup_timeout, _CALL_BOUND)
        self._reserve_ok = True
        # First-sight lookups (see _first_sight): the scheduler thread's
        # time for them per step, what is left of it, and whether the daemon
        # answered the last call (none after one fails until a step answer
        # comes back).
        self._sync_budget = spec._first_sight_s
        self._sync_left = 0.0
        self._sync_ok = True
        # Keys of successful stores no step call has bound yet (count), and
        # the stored keys of each batch sent, in order.
        self._unbound: dict[bytes, int] = {}
        self._batch_stores: deque[list[bytes]] = deque()
        # Keys the daemon said it holds (reserve answers): key -> the step
        # count of the answer, and the same in answer order, so that step
        # ends drop stale ones in proportion to the answers.
        self._held: dict[bytes, int] = {}
        self._held_q: deque[tuple[int, bytes]] = deque()
        self._min_free = min(spec._min_free, self._max_free)
        self._timeout = spec._timeout
        self._lookup_timeout = spec._lookup_timeout
        self._reconnect_interval = spec._reconnect_interval
        self._target = spec._target
        self._reqs: dict[str, Req] = {}
        self._pool: list[int] = []
        self._stored_recent: deque[int] = deque(maxlen=16)  # blocks the recent storing steps wanted to store
        self._step_stores = 0  # blocks this step wanted to store
        self._events: list[vc.OffloadingEvent] = []
        self._events_on = vc.events_enabled(spec)
        self._reset = False
        # The scheduler's view of the link: the generation its batches are
        # for, the epoch its slots belong to, whether it is up.
        link = _steps.Link(1, spec.client(), spec.namespace, spec.epoch, spec.num_chunks)
        self._gen, self._epoch, self._ns = link.gen, link.epoch, link.namespace
        # The link's connection, for EngineReserve (gRPC calls may overlap
        # the sending thread's: one connection, one daemon session).
        self._client = link.client
        self._up = True
        self._invalidated = True  # nothing of a down link is left to drop
        self._attached: _steps.Attached | None = None  # a new link, switched to between steps
        self._in_step = False
        # Step ends so far, and the lookup leases in the order they came:
        # (step count, request id, key).
        self._steps = 0
        self._lease_q: deque[tuple[int, str, bytes]] = deque()
        # The request the last lookup named and its answers (lookup's hot
        # path); None between steps.
        self._lk_ctx: vc.ReqContext | None = None
        self._lk_answer: dict[bytes, vc.LookupResult] = {}
        self._now = time.monotonic()
        # Loads and stores handed to workers and not completed, counted per
        # link generation (_track); the connections of earlier links
        # (old_clients) stay open until theirs are done (a worker may still
        # touch their slots).
        self._users: dict[int, _daemon.Users] = {}
        self._old_clients: dict[int, Client] = {}
        # Jobs in flight at a cache reset, which vLLM never completes,
        # released by on_reset_flushed: the current link's as (generation,
        # request id, load pins, store slots); a down link's as their
        # generations only (its session holds them and goes).
        self._fenced: list[tuple[int, str, dict[bytes, int], dict[bytes, int]]] = []
        self._fenced_stale: list[int] = []
        # Without vLLM's callback: the step ends until the flush is done
        # (the workers finish the flushed jobs in the step after a reset).
        self._flush_in = 0
        # Counters (get_stats and tests): lookups answered MISS past the
        # bound, outages, reattaches.
        self.late_lookups = 0
        self.outages = 0
        self.reattaches = 0
        # prepare_store calls that wanted more leased slots than the pool had,
        # the EngineReserve calls they made, and those that failed
        self.store_shortfalls = 0
        self.reserves = 0
        self.reserve_failures = 0
        # first-sight lookups made, and those that failed
        self.first_sights = 0
        self.first_sight_failures = 0
        # answers of first sights and reserves that came too late, whose
        # leases and slots were given back
        self.late_answers = 0
        self._b = Batch()
        # Step-end calls go out in order on one thread; answers come back
        # through a queue the scheduler thread drains.
        self._sender = _steps.Sender(link, self._attach, self._timeout, self._reconnect_interval, self._target)
        self._answers = self._sender.answers
        self._track(link.gen, link.client)
        self._in_flight = 0
        # A first pool of store slots before the first step (bounded by
        # the call timeout; a daemon gone by now leaves the link down).
        self._post(want=self._min_free)
        try:
            self._handle(self._answers.get(timeout=self._timeout + 1.0))
        except queue.Empty:
            pass

    # -- the step-end call --------------------------------------------------

    def _post(self, want: int) -> None:
        """Hands the batch to the sending thread and starts a new one."""
        b = self._b
        req = b.request(self._ns, self._epoch, want, self._reset)
        for rid, _ in b.new:
            if (r := self._reqs.get(rid)) is not None:
                r.fresh = False
        self._batch_stores.append(b.stored_keys())
        self._reset = False
        self._b = Batch()
        self._in_flight += 1
        self._sender.post(self._gen, req, b.lookups)

    def _attach(self, gen: int) -> _steps.Link:
        """A new connection attached to the daemon's namespace of the
        engine's layout (created anew by a restarted daemon)."""
        c, rep = self._spec.attach()
        return _steps.Link(gen, c, rep.namespace, int(rep.epoch), int(rep.num_slots))

    # -- answers, applied on the scheduler thread ---------------------------

    # -- link switches, between steps --------------------------------------

    # -- OffloadingManager --------------------------------------------------

    def _req(self, ctx: vc.ReqContext) -> Req:
        r = self._reqs.get(ctx.req_id)
        if r is None:
            r = self.on_new_request_state(ctx)
        return r

    def on_new_request_state(self, ctx: vc.ReqContext) -> Req:
        params = json.dumps(ctx.kv_transfer_params) if ctx.kv_transfer_params else ""
        r = Req(ctx=ctx, params=params, fresh=True)
        self._reqs[ctx.req_id] = r
        self._b.new.append((ctx.req_id, params))
        return r

    def on_new_request(self, req_context: vc.ReqContext) -> vc.RequestOffloadingContext:
        if req_context.req_id not in self._reqs:
            self.on_new_request_state(req_context)
        return vc.RequestOffloadingContext()

    def lookup(self, key: vc.OffloadKey, req_context: vc.ReqContext) -> vc.LookupResult:
        # The hot path, a settled key of the request the last lookup named
        # in this step: one identity test and one dict lookup. (vLLM asks
        # key by key: a step of 64 requests with 1 000-block prefixes makes
        # 64 000 of these calls.) _lk_ctx is cleared at every step end, so
        # the first lookup of a step takes the full path, which applies the
        # answers that came in between steps.
        if req_context is self._lk_ctx:
            a = self._lk_answer.get(key)
            if a is not None:
                return a
        return self._lookup(key, req_context)

    def _lookup(self, key: vc.OffloadKey, req_context: vc.ReqContext) -> vc.LookupResult:
        if not self._in_step:
            self._step_begin()
        r = self._reqs.get(req_context.req_id)
        if r is None:
            r = self._req(req_context)
        self._lk_ctx, self._lk_answer = req_context, r.answer
        a = r.answer.get(key)
        if a is not None:
            return a
        if not self._up:
            return _MISS
        deadline = r.asked.get(key)
        if deadline is not None:
            if self._now > deadline:
                # The daemon has not answered within the bound: a miss
                # (its answer, if it comes, gives the pin back).
                del r.asked[key]
                r.answer[key] = _MISS
                self.late_lookups += 1
                return _MISS
            return _RETRY
        if r.fresh and self._sync_left > 0.0:
            a = self._first_sight(r, key, req_context)
            if a is not None:
                return a
        deadline = r.retry_by.pop(key, None) if r.retry_by else None
        if deadline is None:
            deadline = self._now + self._lookup_timeout
        elif self._now > deadline:
            r.answer[key] = _MISS
            self.late_lookups += 1
            return _MISS
        r.asked[key] = deadline
        if (b := self._b.lookups.get(req_context.req_id)) is None:
            self._b.lookups[req_context.req_id] = [key]
        else:
            b.append(key)
        return _RETRY

    def prepare_load(self, keys: Collection[vc.OffloadKey], req_context: vc.ReqContext) -> KvtierSlotSpec:
        r = self._req(req_context)
        slots = []
        for k in keys:
            slot = r.slot.get(k)
            if slot is None:
                raise RuntimeError(f"kvtier: prepare_load of key {bytes(k).hex()} that did not answer HIT")
            slots.append(slot)
            r.lease_at.pop(k, None)
            r.loading[k] = r.loading.get(k, 0) + 1
        self._users[self._gen].acquire(len(slots))
        return KvtierSlotSpec(slots, self._epoch)

    def complete_load(self, keys: Collection[vc.OffloadKey], req_context: vc.ReqContext) -> None:
        r = self._reqs.get(req_context.req_id)
        if r is None:
            return
        unpins = None
        for k in keys:
            if self._stale_done(r.stale_loading, k):
                continue  # its pin went with the old link
            n = r.loading.get(k)
            if n is None:
                continue
            self._done(self._gen)
            if unpins is None:
                unpins = self._b.unpins.setdefault(req_context.req_id, [])
            unpins.append(k)
            if n <= 1:
                del r.loading[k]
                # The pin is going: a later lookup asks the daemon again.
                if r.slot.pop(k, None) is not None:
                    del r.answer[k]
            else:
                r.loading[k] = n - 1
        self._maybe_forget(r)

    def touch(self, keys: Collection[vc.OffloadKey], req_context: vc.ReqContext) -> None:
        if keys and self._up:
            self._b.touches.setdefault(req_context.req_id, []).extend(keys)

    def prepare_store(self, keys: Collection[vc.OffloadKey], req_context: vc.ReqContext) -> vc.PrepareStoreOutput | None:
        if not self._in_step:
            self._step_begin()
        elif not self._answers.empty():
            self._drain()
        if not self._up:
            return None  # vLLM keeps the blocks on the GPU
        r = self._req(req_context)
        # A key this request holds a lease on is in the primary already, and
        # so is one the daemon said it holds: no slot (and no eviction) is
        # spent on a copy.
        held = self._held
        to_store = [k for k in keys if k not in r.slot and k not in r.storing and k not in held]
        if len(to_store) > len(self._pool):
            # Fewer leased slots than the store wants. vLLM never offers
            # these keys again (after any answer but None it moves past every
            # key it offered, and a finished request's blocks are offered
            # once more at most), so the store cannot wait for the step end:
            # one bounded call asks which keys the daemon holds already (a
            # shared system prompt, another engine's document) and leases
            # slots for the rest, up to three quarters of the primary. What
            # still does not fit keeps its leading blocks, since a request's
            # prefix is what later requests can hit.
            self.store_shortfalls += 1
            to_store = self._reserve(to_store)
            if len(to_store) > len(self._pool):
                if not self._pool:
                    return None
                to_store = to_store[:len(self._pool)]
        self._step_stores += len(to_store)
        slots = [self._pool.pop() for _ in to_store]
        for k, s in zip(to_store, slots):
            r.storing[k] = s
        if to_store:
            self._users[self._gen].acquire(len(to_store))
        return vc.PrepareStoreOutput(keys_to_store=list(to_store), store_spec=KvtierSlotSpec(slots, self._epoch), evicted_keys=[])

    def complete_store(self, keys: Collection[vc.OffloadKey], req_context: vc.ReqContext, success: bool = True) -> None:
        r = self._reqs.get(req_context.req_id)
        if r is None:
            return
        ks: list[bytes] = []
        ss: list[int] = []
        for k in keys:
            if self._stale_done(r.stale_storing, k):
                continue  # its slot was the old link's
            s = r.storing.pop(k, None)
            if s is not None:
                self._done(self._gen)
                ks.append(k)
                ss.append(s)
        if ks:
            self._b.stores.append((req_context.req_id, ks, ss, bool(success)))
            if success:
                for kb in ks:
                    self._unbound[kb] = self._unbound.get(kb, 0) + 1
        self._maybe_forget(r)

    def on_request_finished(self, req_context: vc.ReqContext) -> None:
        rid = req_context.req_id
        r = self._reqs.get(rid)
        if r is None:
            return
        # Leases the request never loaded go back with its finish.
        unused = list(r.lease_at)
        if unused:
            self._b.unpins.setdefault(rid, []).extend(unused)
        r.lease_at.clear()
        r.finished = True
        self._b.finished.append(rid)
        self._maybe_forget(r)

    def on_schedule_end(self, context: vc.ScheduleEndContext) -> None:
        self._in_step = False
        self._lk_ctx = None  # the next step's first lookup takes the full path
        self._boundary()
        if self._flush_in and not vc.RESET_FLUSH_CALLBACK:
            self._flush_in -= 1
            if not self._flush_in:
                self.on_reset_flushed()
        if not self._up:
            # Nothing reaches a down link: what the step produced named its
            # session, which is gone or abandoned.
            self._drop_batch()
            return
        # Release the lookup leases unused for lease_steps step ends, in
        # the order they came (work in proportion to the leases that
        # expire, not to those held); an entry whose lease was loaded,
        # released or granted again since is passed over.
        q, limit = self._lease_q, self._steps - self._lease_steps
        while q and q[0][0] <= limit:
            at, rid, k = q.popleft()
            r = self._reqs.get(rid)
            if r is None or r.lease_at.get(k) != at:
                continue
            del r.lease_at[k]
            if r.slot.pop(k, None) is not None:
                del r.answer[k]
            self._b.unpins.setdefault(rid, []).append(k)
        self._steps += 1
        # The pool the next steps will want: the largest of the recent
        # storing steps' stores, at least min_free_slots, at most the cap.
        # Steps that store nothing (decode steps, idle spins) are left out:
        # sixteen of them would otherwise shrink the pool below the next
        # prefill's stores, whose tail would then never be offloaded.
        if self._step_stores:
            self._stored_recent.append(self._step_stores)
        # Reserve answers hold for a few steps: a block the daemon held
        # then may be evicted since, and must then be stored again.
        hq, old = self._held_q, self._steps - _HELD_STEPS
        while hq and hq[0][0] <= old:
            at, k = hq.popleft()
            if self._held.get(k) == at:
                del self._held[k]
        want = min(max(self._min_free, max(self._stored_recent, default=0)), self._max_free, _MAX_FREE)
        self._step_stores = 0
        if len(self._pool) > 2 * want:
            self._b.returns.extend(self._pool[want:])
            del self._pool[want:]
        if context.new_req_ids:
            self._b.scheduled.extend(context.new_req_ids)
        if context.preempted_req_ids:
            self._b.preempted.extend(context.preempted_req_ids)
        if self._in_flight:
            # One step call at a time: while it is out, the steps' work
            # joins the next batch. A queue of calls would grow without
            # bound while vLLM spins on a waiting request, and a lookup
            # would wait behind all of them.
            return
        self._post(want=max(want - len(self._pool), 0) + len(self._pool))

    def has_pending_work(self) -> bool:
        if not self._answers.empty():
            self._drain()
        if self._attached is not None:
            return True  # a step switches to the new link
        if not self._up:
            return self._in_flight > 0
        # Anything for the daemon not sent yet, a step not answered yet, or
        # a lookup not answered yet keeps vLLM stepping.
        # So does a reset's flush that only step ends complete (vLLM
        # without on_reset_flushed).
        return (self._in_flight > 0 or self._b.pending() or self._reset
                or (self._flush_in > 0 and not vc.RESET_FLUSH_CALLBACK)
                or any(r.asked for r in self._reqs.values()))

    def take_events(self) -> Iterable[vc.OffloadingEvent]:
        if not self._answers.empty():
            self._drain()
        out, self._events = self._events, []
        return out

    def reset_cache(self) -> None:
        """vLLM's cache reset: the daemon drops every block no one holds,
        and the lookup leases go back. vLLM never completes the jobs in
        flight at a reset; their pins and slots are given back once the
        workers have reported them (on_reset_flushed)."""
        self._reset = True
        for rid, r in self._reqs.items():
            if r.lease_at:
                self._b.unpins.setdefault(rid, []).extend(r.lease_at)
            r.lease_at.clear()
            r.answer.clear()
            r.slot.clear()
            r.asked.clear()
            r.retry_by.clear()
            if r.loading or r.storing:
                self._fenced.append((self._gen, rid, dict(r.loading), dict(r.storing)))
            for stale in (r.stale_loading, r.stale_storing):
                for gens in stale.values():
                    self._fenced_stale.extend(gens)
            r.loading.clear()
            r.storing.clear()
            r.stale_loading.clear()
            r.stale_storing.clear()
        for r in list(self._reqs.values()):
            self._maybe_forget(r)
        # The flush reaches the workers with the next step and is done
        # when the one after it is scheduled.
        self._flush_in = 2

    def on_reset_flushed(self) -> None:
        """The workers reported every job in flight at the last reset: the
        pins its loads held and the slots its stores wrote go back (to a
        link that is still the current one; an earlier link's session is
        closed once nothing of it is outstanding)."""
        fenced, self._fenced = self._fenced, []
        stale, self._fenced_stale = self._fenced_stale, []
        for g in stale:
            self._done(g)
        for g, rid, loading, storing in fenced:
            if g == self._gen and self._up:
                if loading:
                    self._b.unpins.setdefault(rid, []).extend(k for k, n in loading.items() for _ in range(n))
                if storing:
                    self._b.stores.append((rid, list(storing), list(storing.values()), False))
            self._done(g, sum(loading.values()) + len(storing))

    def shutdown(self) -> None:
        self._sender.stop()
        if not self._answers.empty():
            self._drain()
        if self._attached is not None:  # attached again, never switched to
            self._old_clients[self._gen] = self._attached.old_client
            self._attached = None
        _steps.close_all(self._old_clients.values())
        self._old_clients = {}

