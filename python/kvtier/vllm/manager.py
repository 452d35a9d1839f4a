"""KvtierProxyManager: vLLM's OffloadingManager, answered by a kvtier
daemon without a round trip per key or per request.

Everything the scheduler calls is answered locally:

* ``lookup`` answers from the result of the step's batched call; a key seen
  for the first time answers RETRY and joins the next EngineStep. A HIT is
  a *lookup lease*: the daemon pinned the block for the request and sent
  its slot, so ``prepare_load`` returns the slot without asking, and no
  eviction can take the block first. A lease the request does not use
  within ``lease_steps`` steps (or by its finish) is released.
* ``prepare_store`` assigns slots from a pool of *slot leases* (free slots
  the daemon leased to this engine) and returns at once; the writes are
  bound to their keys with ``complete_store``, at the next step end.
* completions, touches, finishes and new requests are batched into the
  step-end call, which also returns the step's events.

The step-end call runs on a thread of its own: ``on_schedule_end`` hands it
the step's batch and returns; its answer is applied at the next call of
the scheduler. Nothing here blocks the scheduler thread on the daemon.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Collection, Iterable

from kvtier.vllm import _compat as vc

log = logging.getLogger("kvtier.vllm")

_ABSENT = object()
_HIT, _MISS, _RETRY = vc.LookupResult.HIT, vc.LookupResult.MISS, vc.LookupResult.RETRY
_MAX_FREE = 4096  # the daemon's bound on one engine's leased free slots


def _is_slot(v: Any) -> bool:
    """Whether a known-state value is a leased HIT's slot (not a miss,
    not pending; slot 0 included)."""
    return v is not None and v is not False and v is not _ABSENT


@dataclass
class _Req:
    ctx: Any
    params: str
    # key -> slot (a leased HIT), False (miss) or None (being looked up)
    known: dict[bytes, Any] = field(default_factory=dict)
    lease_age: dict[bytes, int] = field(default_factory=dict)  # HITs not loaded yet
    loading: dict[bytes, int] = field(default_factory=dict)    # key -> pins loaded, not completed
    storing: dict[bytes, int] = field(default_factory=dict)    # key -> leased slot being written
    finished: bool = False


class KvtierProxyManager(vc.OffloadingManager):
    def __init__(self, spec: Any) -> None:
        from kvtier.v1 import kvtier_pb2 as pb

        self._pb = pb
        self._spec = spec
        self._client = spec.client()
        self._ns = spec.namespace
        self._lease_steps = spec._lease_steps
        self._min_free = min(spec._min_free, max(spec.num_chunks // 4, 1))
        self._timeout = spec._timeout
        self._reqs: dict[str, _Req] = {}
        self._pool: list[int] = []
        self._stored_recent: deque[int] = deque(maxlen=16)  # blocks stored per step
        self._events: list[Any] = []
        self._events_on = vc.events_enabled(spec)
        self._reset = False
        # Keys of each request's lookups in flight, in the order they were
        # sent: an answer's found bytes are co-indexed with them.
        self._plk: dict[str, deque[list[bytes]]] = {}
        self._new_batch()
        # Step-end calls go out in order on one thread; answers come back
        # through a queue the scheduler thread drains.
        self._out: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._answers: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._in_flight = 0
        self._thread = threading.Thread(target=self._send_loop, name="kvtier-step", daemon=True)
        self._thread.start()
        # A first pool of store slots before the first step.
        self._apply(self._call(self._take_batch(want=self._min_free)))

    # -- the step-end call --------------------------------------------------

    def _new_batch(self) -> None:
        self._b_new: list[tuple[str, str]] = []
        self._b_unpins: dict[str, list[bytes]] = {}
        self._b_stores: list[tuple[str, list[bytes], list[int], bool]] = []
        self._b_touches: dict[str, list[bytes]] = {}
        self._b_lookups: dict[str, list[bytes]] = {}
        self._b_finished: list[str] = []
        self._b_return: list[int] = []

    def _take_batch(self, want: int, scheduled: Collection[str] = (), preempted: Collection[str] = ()) -> Any:
        pb = self._pb
        req = pb.EngineStepRequest(
            namespace=self._ns, want_free_slots=want, finished_request_ids=self._b_finished,
            return_slots=self._b_return, reset_cache=self._reset,
            scheduled_request_ids=list(scheduled), preempted_request_ids=list(preempted),
        )
        for rid, params in self._b_new:
            req.new_requests.add(request_id=rid, kv_transfer_params=params)
        for rid, keys in self._b_unpins.items():
            req.unpins.add(request_id=rid, packed_keys=b"".join(keys), key_size=len(keys[0]))
        for rid, keys, slots, ok in self._b_stores:
            req.stores.add(request_id=rid, packed_keys=b"".join(keys), key_size=len(keys[0]), slots=slots, success=ok)
        for rid, keys in self._b_touches.items():
            req.touches.add(request_id=rid, packed_keys=b"".join(keys), key_size=len(keys[0]))
        for rid, keys in self._b_lookups.items():
            req.lookups.add(request_id=rid, packed_keys=b"".join(keys), key_size=len(keys[0]))
        self._reset = False
        self._new_batch()
        return req

    def _call(self, req: Any) -> Any:
        try:
            return self._client.stub.EngineStep(req, timeout=self._timeout, metadata=self._client._md)
        except Exception as e:  # noqa: BLE001 - a failed step must not kill the scheduler
            log.warning("kvtier: step call failed: %s", e)
            return e

    def _send_loop(self) -> None:
        while True:
            req = self._out.get()
            if req is None:
                return
            self._answers.put((req, self._call(req)))

    def _drain(self) -> None:
        while not self._answers.empty():
            req, rep = self._answers.get_nowait()
            self._in_flight -= 1
            if isinstance(rep, Exception):
                self._failed(req)
            else:
                self._apply(rep)

    def _failed(self, req: Any) -> None:
        """A step the daemon did not answer: its lookups are asked again;
        its stores' slots may be gone with the daemon, so they are not
        reused; the keys it pinned are unknown."""
        for lk in req.lookups:
            r = self._reqs.get(lk.request_id)
            if r is None:
                continue
            n = lk.key_size
            for i in range(0, len(lk.packed_keys), n):
                k = lk.packed_keys[i:i + n]
                if r.known.get(k, _ABSENT) is None:
                    del r.known[k]

    def _apply(self, rep: Any) -> None:
        if isinstance(rep, Exception):
            return
        for lk in rep.lookups:
            r = self._reqs.get(lk.request_id)
            slots = iter(lk.slots)
            n = len(lk.found)
            sent = self._plk.get(lk.request_id)
            batch = sent.popleft() if sent else []
            for i in range(min(n, len(batch))):
                k = batch[i]
                f = lk.found[i]
                if f == 2:  # HIT: a lease on slot
                    slot = next(slots)
                    if r is None or r.finished or r.known.get(k, _ABSENT) is not None:
                        # Nobody will load it: give the pin back.
                        self._b_unpins.setdefault(lk.request_id, []).append(k)
                        continue
                    r.known[k] = slot
                    r.lease_age[k] = 0
                elif f == 1:
                    if r is not None and r.known.get(k, _ABSENT) is None:
                        r.known[k] = False
                elif r is not None and r.known.get(k, _ABSENT) is None:
                    del r.known[k]  # unknown: asked again next time
        self._pool.extend(rep.granted_slots)
        if self._events_on:
            for e in rep.events:
                keys = [e.packed_keys[i:i + e.key_size] for i in range(0, len(e.packed_keys), e.key_size)] if e.key_size else []
                self._events.append(vc.OffloadingEvent(
                    keys=keys, medium=vc.Medium.CPU if e.medium == 1 else vc.Medium.STORAGE, removed=e.removed,
                    locality={1: vc.Locality.LOCAL, 2: vc.Locality.REMOTE}.get(e.locality)))
        for w in rep.warnings:
            log.debug("kvtier: %s", w)

    # -- OffloadingManager --------------------------------------------------

    def _req(self, ctx: Any) -> _Req:
        r = self._reqs.get(ctx.req_id)
        if r is None:
            r = self.on_new_request_state(ctx)
        return r

    def on_new_request_state(self, ctx: Any) -> _Req:
        params = json.dumps(ctx.kv_transfer_params) if ctx.kv_transfer_params else ""
        r = _Req(ctx=ctx, params=params)
        self._reqs[ctx.req_id] = r
        self._b_new.append((ctx.req_id, params))
        return r

    def on_new_request(self, req_context: Any) -> Any:
        if req_context.req_id not in self._reqs:
            self.on_new_request_state(req_context)
        return vc.RequestOffloadingContext()

    def lookup(self, key: Any, req_context: Any) -> Any:
        if not self._answers.empty():
            self._drain()
        r = self._reqs.get(req_context.req_id)
        if r is None:
            r = self._req(req_context)
        st = r.known.get(key, _ABSENT)
        if st is _ABSENT:
            r.known[key] = None
            if (b := self._b_lookups.get(req_context.req_id)) is None:
                self._b_lookups[req_context.req_id] = [key]
            else:
                b.append(key)
            return _RETRY
        if st is None:
            return _RETRY
        return _MISS if st is False else _HIT

    def prepare_load(self, keys: Collection[Any], req_context: Any) -> Any:
        r = self._req(req_context)
        slots = []
        for k in keys:
            slot = r.known.get(k)
            if slot is None or slot is False:
                raise RuntimeError(f"kvtier: prepare_load of key {bytes(k).hex()} that did not answer HIT")
            slots.append(slot)
            r.lease_age.pop(k, None)
            r.loading[k] = r.loading.get(k, 0) + 1
        return vc.CPULoadStoreSpec(slots)

    def complete_load(self, keys: Collection[Any], req_context: Any) -> None:
        r = self._reqs.get(req_context.req_id)
        unpins = self._b_unpins.setdefault(req_context.req_id, [])
        for k in keys:
            unpins.append(k)
            if r is not None and k in r.loading:
                if r.loading[k] <= 1:
                    del r.loading[k]
                    # The pin is going: a later lookup asks the daemon again.
                    r.known.pop(k, None)
                else:
                    r.loading[k] -= 1

    def touch(self, keys: Collection[Any], req_context: Any) -> None:
        if keys:
            self._b_touches.setdefault(req_context.req_id, []).extend(keys)

    def prepare_store(self, keys: Collection[Any], req_context: Any) -> Any:
        if not self._answers.empty():
            self._drain()
        r = self._req(req_context)
        # A key this request holds a lease on is in the primary already.
        to_store = [k for k in keys if not _is_slot(r.known.get(k)) and k not in r.storing]
        if len(to_store) > len(self._pool):
            return None  # no room this step; the pool grows at the step end
        slots = [self._pool.pop() for _ in to_store]
        for k, s in zip(to_store, slots):
            r.storing[k] = s
        if to_store:
            self._stored_recent.append(len(to_store))
        return vc.PrepareStoreOutput(keys_to_store=list(to_store), store_spec=vc.CPULoadStoreSpec(slots), evicted_keys=[])

    def complete_store(self, keys: Collection[Any], req_context: Any, success: bool = True) -> None:
        r = self._reqs.get(req_context.req_id)
        if r is None:
            return
        ks, ss = [], []
        for k in keys:
            s = r.storing.pop(k, None)
            if s is not None:
                ks.append(k)
                ss.append(s)
        if ks:
            self._b_stores.append((req_context.req_id, ks, ss, bool(success)))
        self._maybe_forget(r)

    def on_request_finished(self, req_context: Any) -> None:
        rid = req_context.req_id
        r = self._reqs.get(rid)
        if r is None:
            return
        # Leases the request never loaded go back with its finish.
        unused = list(r.lease_age)
        if unused:
            self._b_unpins.setdefault(rid, []).extend(unused)
        r.lease_age.clear()
        r.finished = True
        self._b_finished.append(rid)
        self._maybe_forget(r)

    def _maybe_forget(self, r: _Req) -> None:
        if r.finished and not r.storing and not r.loading:
            self._reqs.pop(r.ctx.req_id, None)

    def on_schedule_end(self, context: Any) -> None:
        if not self._answers.empty():
            self._drain()
        # Age the lookup leases; release those unused for lease_steps.
        for rid, r in self._reqs.items():
            if not r.lease_age:
                continue
            expired = [k for k, age in r.lease_age.items() if age >= self._lease_steps]
            for k in expired:
                del r.lease_age[k]
                r.known.pop(k, None)
            if expired:
                self._b_unpins.setdefault(rid, []).extend(expired)
            for k in r.lease_age:
                r.lease_age[k] += 1
        # The pool the next steps will want: twice the largest recent
        # step's stores, at least min_free_slots.
        want = min(max(self._min_free, 2 * max(self._stored_recent, default=0)), _MAX_FREE)
        if len(self._pool) > 2 * want:
            self._b_return.extend(self._pool[want:])
            del self._pool[want:]
        sent = self._plk
        for rid, keys in self._b_lookups.items():
            sent.setdefault(rid, deque()).append(keys)
        batch = self._take_batch(want=max(want - len(self._pool), 0) + len(self._pool),
                                 scheduled=context.new_req_ids, preempted=context.preempted_req_ids)
        self._in_flight += 1
        self._out.put(batch)

    def has_pending_work(self) -> bool:
        if not self._answers.empty():
            self._drain()
        # Anything for the daemon not sent yet, a step not answered yet, or
        # a lookup not answered yet keeps vLLM stepping.
        return (self._in_flight > 0 or bool(self._b_lookups or self._b_stores or self._b_unpins or self._b_finished
                                            or self._b_new or self._b_return)
                or any(None in r.known.values() for r in self._reqs.values()))

    def take_events(self) -> Iterable[Any]:
        if not self._answers.empty():
            self._drain()
        out, self._events = self._events, []
        return out

    def reset_cache(self) -> None:
        self._reset = True
        for r in self._reqs.values():
            for k in [k for k, v in r.known.items() if v is False]:
                del r.known[k]

    def shutdown(self) -> None:
        self._out.put(None)
        self._thread.join(self._timeout)
        try:
            self._client.close()
        except Exception:  # noqa: BLE001
            pass

