"""How ``KvtierProxyManager`` takes the daemon's answers, on the scheduler
thread between steps: step answers (lookup leases, granted slots,
events), late answers of bounded calls (given back), and link switches —
a down link's slots forgotten, a new link's requests announced again, old
connections closed once no transfer uses their slots. The manager's
docstring (kvtier.vllm.manager) tells the whole protocol.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Iterable

from kvtier import _daemon
from kvtier.vllm import _compat as vc
from kvtier.vllm import _steps
from kvtier.vllm._mstate import _HIT, _MISS, Batch, Req, State

if TYPE_CHECKING:
    from kvtier.client import Client
    from kvtier.v1 import kvtier_pb2 as pb

log = logging.getLogger("kvtier.vllm")


class Answers(State):
    def _drop_batch(self) -> None:
        """Discards the batch being built (its link is down): its stores
        will never be bound."""
        for _, ks, _, ok in self._b.stores:
            if ok:
                for k in ks:
                    if (n := self._unbound.get(k, 0) - 1) > 0:
                        self._unbound[k] = n
                    else:
                        self._unbound.pop(k, None)
        self._b = Batch()

    def _drain(self) -> None:
        while not self._answers.empty():
            self._handle(self._answers.get_nowait())

    def _handle(self, a: _steps.Answer | _steps.Attached | _steps.Late) -> None:
        if isinstance(a, _steps.Attached):
            self._attached = a  # one reattach at a time: the sending thread waits for no other
            return
        if isinstance(a, _steps.Late):
            self._give_back(a)
            return
        self._in_flight -= 1
        # Answers come back in the order the batches went: this one's
        # stores are bound now (or never will be).
        if self._batch_stores:
            for k in self._batch_stores.popleft():
                if (n := self._unbound.get(k, 0) - 1) > 0:
                    self._unbound[k] = n
                else:
                    self._unbound.pop(k, None)
        if a.gen != self._gen or a.stale:
            return
        if a.err is not None:
            if self._up:
                self._up = False
                self._invalidated = False
                self.outages += 1
            return
        self._apply(a)

    def _apply(self, a: _steps.Answer) -> None:
        rep = a.rep
        if rep is None:
            return  # only a failed or stale answer has none, and it is not applied
        self._reserve_ok = self._sync_ok = True
        self._apply_lookups(rep.lookups, a.lookups)
        self._apply_rest(rep)

    def _apply_lookups(self, answers: Iterable[pb.EngineLookupResult], sent: dict[str, list[bytes]]) -> None:
        """Applies a step call's lookup answers to the keys sent (by request
        id, co-indexed with each answer's found)."""
        for lk in answers:
            rid = lk.request_id
            r = self._reqs.get(rid)
            slots = iter(lk.slots)
            batch = sent.get(rid, ())
            for i in range(min(len(lk.found), len(batch))):
                k = batch[i]
                f = lk.found[i]
                if f == 2:  # HIT: a lease on slot
                    slot = next(slots)
                    if r is None or r.finished or k not in r.asked:
                        # Nobody will load it (answered MISS past the
                        # bound, or the request went): give the pin back.
                        self._b.unpins.setdefault(rid, []).append(k)
                        continue
                    del r.asked[k]
                    r.slot[k] = slot
                    r.answer[k] = _HIT
                    r.lease_at[k] = self._steps
                    self._lease_q.append((self._steps, rid, k))
                elif r is None or k not in r.asked:
                    continue
                elif f == 1:
                    del r.asked[k]
                    r.answer[k] = _MISS
                else:
                    # Not sure yet: asked again next time, within the
                    # deadline of its first ask.
                    r.retry_by[k] = r.asked.pop(k)

    def _apply_rest(self, rep: pb.EngineStepResponse) -> None:
        """A step call's granted slots, events and warnings."""
        self._pool.extend(rep.granted_slots)
        if self._events_on:
            for e in rep.events:
                keys = [vc.OffloadKey(e.packed_keys[i:i + e.key_size])
                        for i in range(0, len(e.packed_keys), e.key_size)] if e.key_size else []
                self._events.append(vc.OffloadingEvent(
                    keys=keys, medium=vc.Medium.CPU if e.medium == 1 else vc.Medium.STORAGE, removed=e.removed,
                    locality={1: vc.Locality.LOCAL, 2: vc.Locality.REMOTE}.get(e.locality)))
        for w in rep.warnings:
            log.debug("kvtier: %s", w)

    def _step_begin(self) -> None:
        """The first call of a step: answers that arrived between steps
        are applied, and a down link is dropped or a new one taken."""
        self._in_step = True
        self._now = time.monotonic()
        self._sync_left = self._sync_budget if self._sync_ok else 0.0
        self._boundary()

    def _boundary(self) -> None:
        if not self._answers.empty():
            self._drain()
        if not self._up and not self._invalidated:
            self._invalidate()
        if self._attached is not None:
            self._switch(self._attached)
            self._attached = None

    def _invalidate(self) -> None:
        """Forgets everything that named the down link's slots: the pool,
        the lookup leases and lookups in flight, the batch. Loads and stores
        handed to workers become stale."""
        self._invalidated = True
        self._pool.clear()
        # What the down link's daemon held says nothing of the next one's.
        self._held.clear()
        self._held_q.clear()
        self._drop_batch()
        for r in self._reqs.values():
            self._stale(r)
            for k in r.slot:  # the leases went with the link; misses stay
                del r.answer[k]
            r.slot.clear()
            r.asked.clear()
            r.retry_by.clear()
            r.lease_at.clear()

    def _stale(self, r: Req) -> None:
        """Moves a request's loads and stores in flight to its stale sets."""
        g = self._gen
        for k, n in r.loading.items():
            r.stale_loading.setdefault(k, []).extend([g] * n)
        for k in r.storing:
            r.stale_storing.setdefault(k, []).append(g)
        r.loading.clear()
        r.storing.clear()

    def _track(self, gen: int, client: Client) -> None:
        """Counts the copies through link gen's slots: once the link is
        replaced and none is left, its connection closes (on the sending
        thread, after what it sends)."""
        def idle() -> None:
            self._users.pop(gen, None)
            if (c := self._old_clients.pop(gen, None)) is not None:
                self._sender.close([c])

        self._users[gen] = _daemon.Users(idle)

    def _switch(self, a: _steps.Attached) -> None:
        link = a.link
        old = self._gen
        self._old_clients[old] = a.old_client
        self._track(link.gen, link.client)
        self._gen, self._epoch, self._ns = link.gen, link.epoch, link.namespace
        self._client = link.client
        self._up = True
        self.reattaches += 1
        # The new session knows no request: announce the live ones again
        # (their lookups start afresh: misses are asked again too).
        for rid, r in list(self._reqs.items()):
            r.answer.clear()
            r.slot.clear()
            r.asked.clear()
            r.retry_by.clear()
            if r.finished:
                self._maybe_forget(r)
            else:
                self._b.new.append((rid, r.params))
        log.warning("kvtier: attached again to %s after %.1fs (namespace %s, epoch %016x, %d slots)", self._target,
                    a.down_for, link.namespace, link.epoch, link.num_slots)
        if (u := self._users.get(old)) is not None:
            u.retire()

    def _done(self, gen: int, n: int = 1) -> None:
        """n copies through link gen's slots completed."""
        if (u := self._users.get(gen)) is not None:
            u.release(n)

    def _stale_done(self, stale: dict[bytes, list[int]], k: bytes) -> bool:
        gens = stale.get(k)
        if gens is None:
            return False
        g = gens.pop()
        if not gens:
            del stale[k]
        self._done(g)
        return True

    def _give_back(self, a: _steps.Late) -> None:
        """Gives back what a call answered too late took on the daemon: a
        reserve's leased slots, a first sight's lookup leases (the request
        asked again, the asynchronous way). A link that went down since
        took them with its session."""
        if a.gen != self._gen or not self._up:
            return
        self.late_answers += 1
        rep = a.rep
        if isinstance(rep, self._pb.EngineReserveResponse):
            self._b.returns.extend(rep.granted_slots)
            return
        self._b.returns.extend(rep.granted_slots)
        for lk in rep.lookups:
            hits = [k for k, f in zip(a.keys, lk.found) if f == 2]
            if hits:
                self._b.unpins.setdefault(lk.request_id, []).extend(hits)

    def _maybe_forget(self, r: Req) -> None:
        if r.finished and not (r.storing or r.loading or r.stale_loading or r.stale_storing):
            self._reqs.pop(r.ctx.req_id, None)
            if self._lk_answer is r.answer:
                self._lk_ctx = None
