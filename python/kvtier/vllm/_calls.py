"""The calls ``KvtierProxyManager``'s scheduler thread waits on, each
bounded (100 ms, or lookup_timeout_s): the *first sight* of a request
(announce it and look up its keys in the asking step) and EngineReserve
(slots for a store the pool is too small for). A call not answered in time
goes on; what it took on the daemon is given back when its answer comes
(``_answers``).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Callable

import grpc

from kvtier.client import rpc_message as _rpc_msg
from kvtier.vllm import _compat as vc
from kvtier.vllm import _steps
from kvtier.vllm._answers import Answers
from kvtier.vllm._mstate import _FIRST_SIGHT_KEYS, _MAX_FREE, _MISS, Req

if TYPE_CHECKING:
    from kvtier.client import Pending

log = logging.getLogger("kvtier.vllm")


class BoundedCalls(Answers):
    def _call_now(self, start: Callable[[Any, float], Pending[Any]], req: Any, timeout: float, rid: str = "",
                  keys: list[bytes] | None = None) -> Any:
        """A call on the scheduler's thread, waited for at most timeout. If
        it is not answered by then it goes on (the daemon may still carry
        it out): its answer, if one comes, is handed to _give_back through
        the answers queue. Raises what the call raised, or
        grpc.FutureTimeoutError."""
        fut = start(req, self._timeout)
        try:
            return fut.result(timeout=timeout)
        except grpc.FutureTimeoutError:
            gen = self._gen

            def late(f: Any) -> None:
                if not f.cancelled() and f.exception() is None:
                    self._answers.put(_steps.Late(gen, rid, keys or [], f.result()))

            fut.add_done_callback(late)
            raise

    def _first_sight(self, r: Req, key: vc.OffloadKey, ctx: vc.ReqContext) -> vc.LookupResult | None:
        """The first lookup of a request the daemon has not been told of:
        one bounded step call announces it and looks up its keys from this
        one on (vLLM records them all before it scans them), so that HITs
        (leased), MISSes and the promotions of blocks on a secondary tier
        start in the step that asks, not the next. Returns the key's answer,
        or None to take the asynchronous path (the call failed, or the key
        is not settled yet)."""
        r.fresh = False
        if self._reset or self._flush_in or self._attached is not None:
            return None  # a reset or a new link goes first, with the step's batch
        keys = vc.request_keys(ctx, key, _FIRST_SIGHT_KEYS)
        if not keys:
            return None
        rid = ctx.req_id
        try:
            self._b.new.remove((rid, r.params))  # this call announces it
        except ValueError:
            return None
        pb = self._pb
        # Its events stay for the next step call: an answer of an earlier
        # one may still be on its way, and events must keep their order.
        req = pb.EngineStepRequest(namespace=self._ns, epoch=self._epoch, keep_events=True)
        req.new_requests.add(request_id=rid, kv_transfer_params=r.params)
        req.lookups.add(request_id=rid, packed_keys=b"".join(keys), key_size=len(keys[0]))
        t0 = time.monotonic()
        try:
            rep = self._call_now(self._client.engine_step_async, req, self._call_bound, rid, keys)
        except Exception as e:  # noqa: BLE001 - the scheduler must not fail on the daemon
            self._b.new.append((rid, r.params))  # announced with the step's batch after all
            self._sync_left, self._sync_ok = 0.0, False
            self.first_sight_failures += 1
            log.debug("kvtier: first-sight lookup of %d keys for %s: %s", len(keys), rid, _rpc_msg(e))
            return None
        finally:
            self._sync_left -= time.monotonic() - t0
        self.first_sights += 1
        deadline = self._now + self._lookup_timeout
        for k in keys:
            r.asked[k] = deadline
        self._apply_lookups(rep.lookups, {rid: keys})
        self._apply_rest(rep)
        # This call went ahead of stores the engine completed that no step
        # call has bound yet: the daemon's MISS for those is not final.
        if self._unbound:
            for k in keys:
                if k in self._unbound and r.answer.get(k) is _MISS:
                    del r.answer[k]
                    r.retry_by[k] = deadline
        return r.answer.get(key)

    def _reserve(self, keys: list[vc.OffloadKey]) -> list[vc.OffloadKey]:
        """EngineReserve for a store the pool is too small for: drops the
        keys the daemon holds (and remembers them for a few steps, for the
        other requests that offer them) and adds the slots it leased to the
        pool. Returns the keys left to store. After a failed call the keys
        come back as they are, and no call is made until a step answer
        shows the daemon answering again."""
        if not self._reserve_ok:
            return keys
        cap = min(self._max_burst, _MAX_FREE)
        req = self._pb.EngineReserveRequest(
            namespace=self._ns, epoch=self._epoch, packed_keys=b"".join(keys), key_size=len(keys[0]),
            more_slots=max(cap - len(self._pool), 0), free_slots=len(self._pool))
        try:
            rep = self._call_now(self._client.engine_reserve_async, req, self._call_bound)
        except Exception as e:  # noqa: BLE001 - the scheduler must not fail on the daemon
            self._reserve_ok = False
            self.reserve_failures += 1
            log.debug("kvtier: EngineReserve of %d keys: %s", len(keys), _rpc_msg(e))
            return keys
        self.reserves += 1
        found, step, held = rep.found, self._steps, self._held
        out: list[vc.OffloadKey] = []
        for i, k in enumerate(keys):
            if i < len(found) and found[i] == 2:  # the daemon holds it
                held[k] = step
                self._held_q.append((step, k))
            else:
                out.append(k)
        self._pool.extend(rep.granted_slots)
        return out
