"""KvtierSecondaryTier: kvtier as one out-of-tree secondary tier of vLLM.

vLLM's TieringOffloadingManager keeps its CPU primary in a shared-memory
region and asks its secondary tiers, in order, for the chunks it lacks.
This tier registers that region with a kvtier daemon and lets kvtier's own
tiers (fs, s3, redis, ...) stand behind it: kvtier applies each request's
``kv_load_tiers`` / ``kv_store_tiers`` (or its server defaults) to them.

The tier never makes vLLM's scheduler wait on the daemon:

* ``lookup`` answers from a per-request cache. The first lookup of a
  request makes one bounded call (the *first sight*) about all its keys
  from there on, which vLLM has recorded by then, so that misses and hits
  the daemon can tell at once are answered in the step that asks; the
  calls of one step share ``first_sight_ms``. Any other key not seen
  before answers RETRY and joins the step's batch, sent at
  ``on_schedule_end`` as one RegionLookups call for all the step's
  requests, on a thread of its own; the next step answers from the result. After a failed or partial load the keys that did not arrive
  turn to MISS, so vLLM does not promote them again every step.
* ``submit_store`` / ``submit_load`` enqueue; results stream back and
  ``get_finished_jobs`` drains them.
* ``drain_jobs`` waits (bounded) for the outstanding jobs.

If the daemon goes away, jobs in flight are reported failed once the
daemon has released the region (or died), lookups answer MISS, and the
tier registers the region again in the background when the daemon is back.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from typing import Any, Collection, Iterable

from kvtier import _daemon
from kvtier.vllm import _compat as vc
from kvtier.vllm import _region

log = logging.getLogger("kvtier.vllm")

_ABSENT = object()
_HIT, _MISS, _RETRY = vc.LookupResult.HIT, vc.LookupResult.MISS, vc.LookupResult.RETRY
_FIRST_SIGHT_KEYS = 4096  # keys one first-sight lookup asks about
_FIRST_SIGHT_WAIT_US = 3000  # how long its daemon waits for asynchronous tiers (as engine_lookup_settle)
_FIRST_SIGHT_TIMEOUT = 0.1  # seconds, the most one may hold the scheduler


class KvtierSecondaryTier(vc.SecondaryTierManager):
    """A dynamic secondary tier (no medium, no locality: vLLM always asks
    it) backed by a kvtier daemon on this host.

    Keys of its entry in ``secondary_tiers``:

    * ``target`` — the daemon's Unix socket (``unix:///run/kvtier/kvtier.sock``);
    * ``token`` — the daemon's auth token, if it wants one;
    * ``timeout_s`` — bound on one call to the daemon (default 10);
    * ``drain_timeout_s`` — bound on ``drain_jobs`` (default 60);
    * ``reconnect_interval_s`` — how often to try a daemon that went away
      (default 1);
    * ``first_sight_ms`` — the scheduler thread's time per step for the
      first lookups of new requests (default 5; 0: none).
    """

    medium = None

    def __init__(
        self,
        offloading_spec: vc.OffloadingSpec,
        primary_kv_view: memoryview,
        tier_type: str,
        backpressure_detector: vc.BackpressureDetector | None = None,
        target: str = "unix:///run/kvtier/kvtier.sock",
        token: str | None = None,
        token_file: str | None = None,
        timeout_s: float = 10.0,
        drain_timeout_s: float = 60.0,
        reconnect_interval_s: float = 1.0,
        first_sight_ms: float = 5.0,
        **unknown: Any,
    ) -> None:
        if unknown:
            raise TypeError(
                f"kvtier tier: unknown key(s) {sorted(unknown)} in its secondary_tiers entry "
                "(known: target, token, token_file, timeout_s, drain_timeout_s, reconnect_interval_s, first_sight_ms)"
            )
        if not float(first_sight_ms) >= 0:
            raise ValueError(f"kvtier tier: first_sight_ms {first_sight_ms!r}: want a number of milliseconds >= 0")
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        self.locality = None
        self._path = _region.unix_path(target)
        self._target = target
        from kvtier.client import token_of

        self._token = token_of(token, token_file, "kvtier tier")
        self._timeout = float(timeout_s)
        self._drain_timeout = float(drain_timeout_s)
        self._reconnect_interval = float(reconnect_interval_s)
        # First sights (see lookup): the budget per step, what is left of
        # it, and whether the daemon answered the last lookup (none after
        # one fails until an asynchronous answer comes back).
        self._sync_budget = float(first_sight_ms) / 1000
        self._sync_left = self._sync_budget
        self._sync_ok = True
        self.first_sights = 0
        self._layout = vc.region_layout(offloading_spec, primary_kv_view)
        self._events_on = vc.events_enabled(offloading_spec)

        # Queues the link's threads fill; the scheduler thread drains them.
        self._answers: queue.SimpleQueue[tuple[str, list[bytes], bytes | None]] = queue.SimpleQueue()
        self._results: queue.SimpleQueue[_region.Result] = queue.SimpleQueue()
        self._events: queue.SimpleQueue[list[_region.Event]] = queue.SimpleQueue()

        # Scheduler-thread state.
        # Per request: key -> None (being looked up) | found. A key's
        # requests, to turn a lost block into a miss for all of them.
        self._state: dict[str, dict[bytes, bool | None]] = {}
        self._key_reqs: dict[bytes, set[str]] = {}
        self._batch: dict[str, list[bytes]] = {}
        self._inflight_lookups = 0
        self._params: dict[str, str] = {}
        self._outstanding: dict[int, vc.TransferJob] = {}
        self._ready: list[vc.JobResult] = []
        self._finished: list[str] = []
        self._touches: list[tuple[str, list[bytes]]] = []

        self._link: _region.RegionLink | None = self._connect()
        self._next_link: _region.RegionLink | None = None
        self._down_for = 0.0  # how long the daemon was away, set with _next_link
        self._reconnecting: threading.Thread | None = None
        self._closed = False
        log.info(
            "kvtier tier: region of %d chunks of %d bytes registered with %s as %s (namespace %s)",
            self._layout["num_blocks"], self._layout["row_stride"], target, self._link.region_id, self._link.namespace,
        )

    # -- connection -------------------------------------------------------

    def _connect(self) -> _region.RegionLink:
        fd = vc.region_fd(self._offloading_spec)
        try:
            return _region.RegionLink(
                self._path, self._layout, fd, token=self._token, timeout=self._timeout,
                on_lookup=lambda rid, keys, found: self._answers.put((rid, keys, found)),
                results=self._results, events=self._events,
            )
        except _region.DaemonUnavailable as e:
            raise _region.DaemonUnavailable(f"kvtier tier (target {self._target}): {e}") from e
        finally:
            _region.close_fd(fd)

    def _check_link(self) -> None:
        """Notices a daemon that released the region (or died) and a
        reconnection that succeeded."""
        link = self._link
        if link is not None and link.dead.is_set():
            log.warning("kvtier tier: the daemon at %s released the region; %d jobs in flight fail, lookups miss until it is back", self._target, len(self._outstanding))
            self._link = None
            link.close(0)
            for job_id in list(self._outstanding):
                self._results.put(_region.Result(job_id, False))
            for st in self._state.values():
                for k in [k for k, v in st.items() if v is None]:
                    del st[k]
            self._inflight_lookups = 0
        if self._link is None and not self._closed:
            if self._next_link is not None:
                self._link, self._next_link = self._next_link, None
                log.info("kvtier tier: region registered again with %s as %s after %.1fs", self._target,
                         self._link.region_id, self._down_for)
            elif self._reconnecting is None or not self._reconnecting.is_alive():
                self._reconnecting = threading.Thread(target=self._reconnect, name="kvtier-reconnect", daemon=True)
                self._reconnecting.start()

    def _reconnect(self) -> None:
        again = _daemon.Reattach("kvtier tier", self._target, self._reconnect_interval, log)
        again.start()
        while not self._closed:
            time.sleep(again.wait())
            try:
                link = self._connect()
            except Exception as e:  # noqa: BLE001 - the daemon is still away
                again.failed(e)
                continue
            self._down_for = again.back()
            self._next_link = link
            return

    # -- lookups ----------------------------------------------------------

    def _params_of(self, ctx: vc.ReqContext) -> str:
        rid = ctx.req_id
        p = self._params.get(rid)
        if p is None:
            p = json.dumps(ctx.kv_transfer_params) if ctx.kv_transfer_params else ""
            self._params[rid] = p
        return p

    def _drain_answers(self) -> None:
        answers = self._answers
        while not answers.empty():
            rid, keys, found = answers.get_nowait()
            self._inflight_lookups -= 1
            if found is not None:
                self._sync_ok = True
            st = self._state.get(rid)
            if st is None:
                continue  # the request finished meanwhile
            for i, k in enumerate(keys):
                if k not in st or st[k] is not None:
                    continue
                f = found[i] if found is not None and i < len(found) else _region.UNKNOWN
                if f == _region.HIT:
                    st[k] = True
                elif f == _region.MISS:
                    st[k] = False
                else:
                    self._forget(rid, k)  # ask again

    def _note(self, rid: str, k: bytes) -> None:
        """Records that request rid has an answer for k (pending or
        settled), so that a lost block turns into a miss for it."""
        if (rs := self._key_reqs.get(k)) is None:
            self._key_reqs[k] = {rid}
        else:
            rs.add(rid)

    def _forget(self, rid: str, k: bytes) -> None:
        st = self._state.get(rid)
        if st is not None:
            st.pop(k, None)
        if rs := self._key_reqs.get(k):
            rs.discard(rid)
            if not rs:
                del self._key_reqs[k]

    def lookup(self, key: vc.OffloadKey, req_context: vc.ReqContext) -> vc.LookupResult:
        # The hot path: vLLM calls it for every key of every waiting
        # request, every step.
        if not self._answers.empty():
            self._drain_answers()
        link = self._link
        if link is None or link.dead.is_set():
            self._check_link()
            link = self._link
        rid = req_context.req_id
        st = self._state.get(rid)
        if st is None:
            st = self._state[rid] = {}
            if self._sync_left > 0.0 and link is not None and not link.dead.is_set():
                a = self._first_sight(link, st, key, req_context)
                if a is not None:
                    return a
        found = st.get(key, _ABSENT)
        if found is True:
            return _HIT
        if found is False:
            return _MISS
        if found is None:
            return _RETRY
        if link is None:
            return _MISS
        st[key] = None
        self._note(rid, key)
        if (b := self._batch.get(rid)) is None:
            self._params_of(req_context)
            self._batch[rid] = [key]
        else:
            b.append(key)
        return _RETRY

    def _first_sight(self, link: _region.RegionLink, st: dict[bytes, bool | None], key: vc.OffloadKey,
                     ctx: vc.ReqContext) -> vc.LookupResult | None:
        """The first lookup of a request: one bounded RegionLookup about its
        keys from this one on (waiting a few milliseconds for the daemon's
        asynchronous tiers), on the scheduler's thread. Settled keys are
        cached as the asynchronous answers are; returns the key's answer, or
        None to take the asynchronous path."""
        keys = vc.request_keys(ctx, key, _FIRST_SIGHT_KEYS)
        if not keys:
            return None
        rid = ctx.req_id
        t0 = time.monotonic()
        found = link.lookup_now(rid, self._params_of(ctx), keys, wait_us=_FIRST_SIGHT_WAIT_US,
                                timeout=min(self._timeout, _FIRST_SIGHT_TIMEOUT))
        self._sync_left -= time.monotonic() - t0
        if found is None:
            self._sync_left, self._sync_ok = 0.0, False
            return None
        self.first_sights += 1
        for k, f in zip(keys, found):
            if f == _region.HIT or f == _region.MISS:
                st[k] = f == _region.HIT
                self._note(rid, k)
        a = st.get(key)
        return None if a is None else (_HIT if a else _MISS)

    def _mark_miss(self, keys: Iterable[bytes]) -> None:
        for k in keys:
            for rid in self._key_reqs.get(k, ()):
                st = self._state.get(rid)
                if st is not None and st.get(k) is True:
                    st[k] = False

    # -- jobs -------------------------------------------------------------

    def _submit(self, job: vc.TransferJob, promotion: bool) -> None:
        self._check_link()
        keys = list(job.keys)
        self._outstanding[job.job_id] = job
        if self._link is None:
            self._results.put(_region.Result(job.job_id, False))
            return
        self._link.submit(_region.Job(
            job_id=job.job_id, request_id=job.req_context.req_id, params=self._params_of(job.req_context),
            keys=keys, slots=[int(s) for s in job.chunk_ids], promotion=promotion,
        ))

    def submit_store(self, job_metadata: vc.TransferJob) -> None:
        self._submit(job_metadata, False)

    def submit_load(self, job_metadata: vc.TransferJob) -> None:
        self._submit(job_metadata, True)

    def _take_result(self, r: _region.Result) -> vc.JobResult | None:
        job = self._outstanding.pop(r.job_id, None)
        if job is None:
            return None  # already failed when the daemon went away
        if r.success:
            return vc.JobResult(job_id=r.job_id, success=True)
        keys = list(job.keys)
        loaded = [keys[i] for i in (r.loaded or []) if i < len(keys)]
        if job.is_promotion:
            got = set(bytes(k) for k in loaded)
            self._mark_miss(bytes(k) for k in keys if bytes(k) not in got)
        return vc.JobResult(job_id=r.job_id, success=False, successful_keys=loaded or None)

    def get_finished_jobs(self) -> Iterable[vc.JobResult]:
        self._check_link()
        out, self._ready = self._ready, []
        while True:
            try:
                r = self._results.get_nowait()
            except queue.Empty:
                break
            if (jr := self._take_result(r)) is not None:
                out.append(jr)
        return out

    def drain_jobs(self) -> None:
        deadline = time.monotonic() + self._drain_timeout
        while self._outstanding:
            self._check_link()
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                r = self._results.get(timeout=min(left, 0.05))
            except queue.Empty:
                continue
            if (jr := self._take_result(r)) is not None:
                self._ready.append(jr)
        if self._outstanding:
            # Never report a job failed while the daemon may still copy into
            # its slots: release the region first (the daemon answers only
            # after its transfers end), then fail what is left.
            log.error("kvtier tier: %d jobs still in flight after drain_timeout_s=%s; releasing the region", len(self._outstanding), self._drain_timeout)
            if self._link is not None:
                if not self._link.close(max(self._timeout, 60.0)):
                    log.error("kvtier tier: the daemon did not release the region in time")
                self._link = None
            for job_id in list(self._outstanding):
                self._ready.append(vc.JobResult(job_id=job_id, success=False))
                del self._outstanding[job_id]

    def has_pending_work(self) -> bool:
        return bool(self._outstanding or self._batch or self._inflight_lookups > 0 or self._finished)

    # -- requests and steps -----------------------------------------------

    def on_new_request(self, req_context: vc.ReqContext) -> vc.RequestOffloadingContext:
        self._params_of(req_context)
        return vc.RequestOffloadingContext()

    def touch(self, keys: Collection[vc.OffloadKey], req_context: vc.ReqContext) -> None:
        if keys:
            self._touches.append((req_context.req_id, [bytes(k) for k in keys]))

    def on_request_finished(self, req_context: vc.ReqContext) -> None:
        rid = req_context.req_id
        for k in self._state.pop(rid, {}):
            if rs := self._key_reqs.get(k):
                rs.discard(rid)
                if not rs:
                    del self._key_reqs[k]
        self._batch.pop(rid, None)
        self._params.pop(rid, None)
        self._finished.append(rid)

    def on_schedule_end(self, context: vc.ScheduleEndContext) -> None:
        self._drain_answers()
        self._sync_left = self._sync_budget if self._sync_ok else 0.0
        self._check_link()
        link = self._link
        if link is None:
            self._batch.clear()
            self._finished.clear()
            self._touches.clear()
            return
        if self._batch:
            batch = [(rid, self._params.get(rid, ""), keys) for rid, keys in self._batch.items()]
            self._inflight_lookups += len(batch)
            self._batch = {}
            link.lookup(batch)
        link.step(self._finished, self._touches)
        self._finished, self._touches = [], []

    def take_events(self) -> Iterable[vc.OffloadingEvent]:
        out = []
        while True:
            try:
                evs = self._events.get_nowait()
            except queue.Empty:
                break
            if not self._events_on:
                continue
            for e in evs:
                out.append(vc.OffloadingEvent(
                    keys=[vc.OffloadKey(k) for k in e.keys],
                    medium=vc.Medium.CPU if e.medium == 1 else vc.Medium.STORAGE,
                    removed=e.removed,
                    locality={1: vc.Locality.LOCAL, 2: vc.Locality.REMOTE}.get(e.locality),
                ))
        return out

    def shutdown(self) -> None:
        self._closed = True
        if self._link is not None:
            if not self._link.close(max(self._timeout, 60.0)):
                log.error("kvtier tier: the daemon did not release the region before shutdown")
            self._link = None
        if self._next_link is not None:
            self._next_link.close(self._timeout)
            self._next_link = None

    # -- introspection ----------------------------------------------------

    @property
    def region_id(self) -> str | None:
        """The daemon's id of the registered region (None while away)."""
        return self._link.region_id if self._link is not None else None

    @property
    def namespace(self) -> str | None:
        """The daemon namespace the region's layout names."""
        return self._link.namespace if self._link is not None else None
