"""The daemon side of tier mode: a registered region and its threads.

A RegionLink registers the engine's region on the daemon's region socket
(the descriptor travels with SCM_RIGHTS) and talks to the daemon on
threads of its own, so that the scheduler thread never waits on a round
trip:

* the lookup thread sends a step's lookups, every request's, in one
  RegionLookups call (steps that end while a call is out join the next);
* the job thread sends submits and step ends, in the order they were made;
* the results thread reads the RegionResults stream.

The region lives as long as the registration socket. The daemon closes its
end only after every transfer into or out of the region has finished, so
end-of-file on that socket is the signal that no job of the link can still
touch vLLM's memory: only then are the jobs still outstanding reported
failed to vLLM (which may then reuse their slots).

Nothing here imports vLLM.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import grpc

from kvtier._daemon import DaemonUnavailable
from kvtier.client import Client, Results
from kvtier.client import rpc_message as _rpc_msg
from kvtier.v1 import kvtier_pb2 as pb

log = logging.getLogger("kvtier.vllm")

#: Answers of RegionLookup, one byte per key.
UNKNOWN, MISS, HIT = pb.REGION_FOUND_UNKNOWN, pb.REGION_FOUND_MISS, pb.REGION_FOUND_HIT


__all__ = ["DaemonUnavailable", "RegionLink", "register", "unix_path"]


def unix_path(target: str) -> str:
    """The socket path of a target: unix://PATH, unix:PATH or a path."""
    for prefix in ("unix://", "unix:"):
        if target.startswith(prefix):
            return target[len(prefix):]
    if "/" in target or target.endswith(".sock"):
        return target
    raise ValueError(
        f"kvtier tier mode needs the daemon's Unix socket (the region travels as a file "
        f"descriptor); target {target!r} is not one (want unix:///path/kvtier.sock)"
    )


#: Keys in one RegionLookups call: under the daemon's default
#: limits.max_keys_per_call (65536), so that a storm of arrivals is split
#: rather than refused.
_MAX_LOOKUP_KEYS = 32768


def _split(batch: list[tuple[str, str, list[bytes]]], max_keys: int) -> list[list[tuple[str, str, list[bytes]]]]:
    """Cuts a batch of lookups into calls of at most max_keys keys (a
    request with more keys than that goes alone)."""
    parts: list[list[tuple[str, str, list[bytes]]]] = []
    cur: list[tuple[str, str, list[bytes]]] = []
    n = 0
    for entry in batch:
        if cur and n + len(entry[2]) > max_keys:
            parts.append(cur)
            cur, n = [], 0
        cur.append(entry)
        n += len(entry[2])
    if cur:
        parts.append(cur)
    return parts


def _pack(keys: Sequence[bytes]) -> tuple[bytes, int]:
    if not keys:
        return b"", 0
    size = len(keys[0])
    for k in keys:
        if len(k) != size:
            raise ValueError(f"kvtier: keys of different lengths ({size} and {len(k)}) in one batch")
    return b"".join(keys), size


@dataclass
class Job:
    job_id: int
    request_id: str
    params: str
    keys: Sequence[bytes]
    slots: list[int]
    promotion: bool


@dataclass
class Result:
    job_id: int
    success: bool
    loaded: list[int] | None = None  # indexes of a partial promotion


@dataclass
class Event:
    keys: list[bytes]
    medium: int
    locality: int
    removed: bool
    tier: str


@dataclass
class _Step:
    finished: list[str] = field(default_factory=list)
    touches: list[tuple[str, list[bytes]]] = field(default_factory=list)


def register(path: str, layout: dict[str, Any], fd: int, timeout: float) -> tuple[socket.socket, str, str]:
    """Registers a region on the daemon's region socket; returns the held
    socket, the region id and its namespace."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(path + ".region")
        socket.send_fds(s, [json.dumps(layout).encode()], [fd])
        line = b""
        while not line.endswith(b"\n"):
            chunk = s.recv(4096)
            if not chunk:
                raise DaemonUnavailable(f"kvtier daemon at {path} closed the region socket without answering")
            line += chunk
    except OSError as e:
        s.close()
        raise DaemonUnavailable(f"kvtier daemon at {path}: cannot register the region ({e}); is `kvtier serve` running with server.unix_socket: {path}?") from e
    rep = json.loads(line)
    if rep.get("error"):
        s.close()
        raise ValueError(f"kvtier daemon at {path} refused the region: {rep['error']}")
    s.settimeout(None)
    return s, rep["region_id"], rep["namespace"]


class RegionLink:
    """One registration of the region and the threads that serve it.

    Calls from the scheduler thread (lookup, submit, step) only enqueue.
    Answers come back through the queues the owner drains: lookups into
    on_lookup, job results into results. dead is set once the region
    socket has reached end-of-file (the daemon released the region)."""

    def __init__(
        self,
        path: str,
        layout: dict[str, Any],
        fd: int,
        *,
        token: str | None,
        timeout: float,
        on_lookup: Callable[[str, list[bytes], bytes | None], None],
        results: "queue.SimpleQueue[Result]",
        events: "queue.SimpleQueue[list[Event]]",
    ) -> None:
        self.path = path
        self._sock, self.region_id, self.namespace = register(path, layout, fd, timeout)
        self._timeout = timeout
        # A connection of its own (see kvtier.Client): one engine, one session.
        self._client = Client("unix://" + path, token=token)
        self._on_lookup = on_lookup
        self._one_by_one = False  # the daemon lacks RegionLookups
        # Lookup RPCs sent by the lookup thread, and first sights (tests,
        # benchmarks).
        self.lookup_calls = 0
        self.first_sight_calls = 0
        self._results = results
        self._events = events
        self._lookups: "queue.SimpleQueue[list[tuple[str, str, list[bytes]]] | None]" = queue.SimpleQueue()
        self._jobs: "queue.SimpleQueue[Any]" = queue.SimpleQueue()
        self.dead = threading.Event()
        self._stopping = threading.Event()
        self._stream: Results | None = None
        self._threads = [
            threading.Thread(target=self._lookup_loop, name="kvtier-lookup", daemon=True),
            threading.Thread(target=self._job_loop, name="kvtier-jobs", daemon=True),
            threading.Thread(target=self._results_loop, name="kvtier-results", daemon=True),
            threading.Thread(target=self._watch_loop, name="kvtier-region", daemon=True),
        ]
        for t in self._threads:
            t.start()

    # -- called from the scheduler thread --------------------------------

    def lookup(self, batch: list[tuple[str, str, list[bytes]]]) -> None:
        """Posts one step's lookups: (request id, params, keys) per request."""
        self._lookups.put(batch)

    def lookup_now(self, req_id: str, params: str, keys: list[bytes], *, wait_us: int, timeout: float) -> bytes | None:
        """One RegionLookup on the calling thread (a first sight), the
        daemon waiting at most wait_us for asynchronous tiers; None when it
        failed."""
        self.first_sight_calls += 1
        try:
            packed, size = _pack(keys)
            rep = self._client.region_lookup(pb.RegionLookupRequest(
                region_id=self.region_id, request_id=req_id, kv_transfer_params=params, packed_keys=packed,
                key_size=size, wait_us=wait_us), timeout=timeout)
            return bytes(rep.found)
        except (grpc.RpcError, ValueError) as e:
            log.debug("kvtier: first-sight lookup of %d keys for request %s: %s", len(keys), req_id, _rpc_msg(e))
            return None

    def submit(self, job: Job) -> None:
        self._jobs.put(job)

    def step(self, finished: list[str], touches: list[tuple[str, list[bytes]]]) -> None:
        self._jobs.put(_Step(finished, touches))

    # -- threads ----------------------------------------------------------

    def _lookup_loop(self) -> None:
        while True:
            batch = self._lookups.get()
            if batch is None:
                return
            # Steps that ended while the last call was out join this one:
            # however many requests arrive, one call is out at a time and
            # the next carries everything that came meanwhile.
            while True:
                try:
                    more = self._lookups.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    self._lookups.put(None)
                    break
                batch.extend(more)
            for part in _split(batch, _MAX_LOOKUP_KEYS):
                for (req_id, _, keys), found in zip(part, self._lookup_part(part)):
                    self._on_lookup(req_id, keys, found)

    def _lookup_part(self, part: list[tuple[str, str, list[bytes]]]) -> list[bytes | None]:
        """The answers of one RegionLookups call: per request, a RegionFound
        per key, or None when it failed (the caller turns that into misses)."""
        if self.dead.is_set():
            return [None] * len(part)
        if self._one_by_one:
            return [self._lookup_one(req_id, params, keys) for req_id, params, keys in part]
        req = pb.RegionLookupsRequest(region_id=self.region_id)
        try:
            for req_id, params, keys in part:
                packed, size = _pack(keys)
                req.lookups.add(request_id=req_id, kv_transfer_params=params, packed_keys=packed, key_size=size)
            self.lookup_calls += 1
            rep = self._client.region_lookups(req, timeout=self._timeout)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                # A daemon older than RegionLookups: one call per request.
                log.info("kvtier: the daemon at %s has no RegionLookups; asking request by request", self.path)
                self._one_by_one = True
                return self._lookup_part(part)
            log.warning("kvtier: lookup of %d requests failed: %s", len(part), _rpc_msg(e))
            return [None] * len(part)
        except ValueError as e:
            log.warning("kvtier: lookup of %d requests not sent: %s", len(part), e)
            return [None] * len(part)
        out: list[bytes | None] = []
        for (req_id, _, keys), a in zip(part, rep.lookups):
            if a.error:
                log.warning("kvtier: lookup of %d keys for request %s failed: %s", len(keys), req_id, a.error)
                out.append(None)
            else:
                out.append(a.found)
        out.extend([None] * (len(part) - len(out)))
        return out

    def _lookup_one(self, req_id: str, params: str, keys: list[bytes]) -> bytes | None:
        self.lookup_calls += 1
        try:
            packed, size = _pack(keys)
            rep = self._client.region_lookup(
                pb.RegionLookupRequest(region_id=self.region_id, request_id=req_id, kv_transfer_params=params, packed_keys=packed, key_size=size),
                timeout=self._timeout,
            )
            return bytes(rep.found)
        except (grpc.RpcError, ValueError) as e:
            log.warning("kvtier: lookup of %d keys for request %s failed: %s", len(keys), req_id, _rpc_msg(e))
            return None

    def _job_loop(self) -> None:
        while True:
            item = self._jobs.get()
            if item is None:
                return
            # Take everything queued so far: consecutive jobs go in one
            # RegionSubmit, step ends in order between them.
            items = [item]
            while True:
                try:
                    nxt = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    self._jobs.put(None)
                    break
                items.append(nxt)
            jobs: list[Job] = []
            for it in items:
                if isinstance(it, Job):
                    jobs.append(it)
                    continue
                self._send_jobs(jobs)
                jobs = []
                self._send_step(it)
            self._send_jobs(jobs)

    def _send_jobs(self, jobs: list[Job]) -> None:
        if not jobs:
            return
        if self.dead.is_set():
            for j in jobs:
                self._results.put(Result(j.job_id, False))
            return
        req = pb.RegionSubmitRequest(region_id=self.region_id)
        for j in jobs:
            packed, size = _pack(j.keys)
            req.jobs.add(job_id=j.job_id, request_id=j.request_id, kv_transfer_params=j.params, promotion=j.promotion, packed_keys=packed, key_size=size, slots=j.slots)
        try:
            self._client.region_submit(req, timeout=self._timeout)
        except grpc.RpcError as e:
            # The daemon did not take them: no transfer touches their
            # slots, so they fail now.
            log.warning("kvtier: %d jobs not submitted: %s", len(jobs), _rpc_msg(e))
            for j in jobs:
                self._results.put(Result(j.job_id, False))

    def _send_step(self, st: _Step) -> None:
        if self.dead.is_set():
            return
        req = pb.RegionStepRequest(region_id=self.region_id, finished_request_ids=st.finished)
        for rid, keys in st.touches:
            packed, size = _pack(keys)
            req.touches.add(request_id=rid, packed_keys=packed, key_size=size)
        try:
            rep = self._client.region_step(req, timeout=self._timeout)
        except grpc.RpcError as e:
            log.warning("kvtier: step end failed: %s", _rpc_msg(e))
            return
        if rep.events:
            evs = []
            for ev in rep.events:
                keys = [ev.packed_keys[i : i + ev.key_size] for i in range(0, len(ev.packed_keys), ev.key_size)] if ev.key_size else []
                evs.append(Event(keys, ev.medium, ev.locality, ev.removed, ev.tier))
            self._events.put(evs)

    def _results_loop(self) -> None:
        try:
            self._stream = stream = self._client.region_results(self.region_id)
            for rep in stream:
                for r in rep.results:
                    self._results.put(Result(r.job_id, r.success, list(r.successful_indexes) if not r.success else None))
        except grpc.RpcError as e:
            if not self._stopping.is_set():
                log.warning("kvtier: the results stream of region %s ended: %s", self.region_id, _rpc_msg(e))

    def _watch_loop(self) -> None:
        """Waits for the region socket's end-of-file: the daemon released
        the region (it closed it, or died)."""
        try:
            while self._sock.recv(4096):
                pass
        except OSError:
            pass
        self.dead.set()

    # -- teardown ---------------------------------------------------------

    def close(self, timeout: float) -> bool:
        """Ends the registration; returns True once the daemon has
        released the region (no transfer touches it) within timeout."""
        self._stopping.set()
        # Let what is queued reach the daemon before the region goes.
        self._lookups.put(None)
        self._jobs.put(None)
        for t in self._threads[:2]:
            t.join(min(timeout, self._timeout))
        try:
            self._sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        released = self.dead.wait(timeout)
        if self._stream is not None:
            self._stream.cancel()
        self._client.close()
        self._sock.close()
        return released


def monotonic() -> float:
    return time.monotonic()


def close_fd(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass
