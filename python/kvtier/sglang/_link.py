"""The daemon side of the SGLang backend: one attach to a kvtier daemon.

A Link is one connection (a daemon session) attached to one epoch of the
namespace of the engine's layout, with the daemon's arena mapped into this
process. Everything the backend holds on the daemon belongs to it: the
requests it opened, the pins of its lookups, its leased free slots. When
the connection closes, the daemon releases all of it.

A Link goes *down* when a call fails (the daemon died, restarted, is slow
or unreachable). It is closed only when no thread still copies through
it (``_daemon.Users``): a slow daemon keeps the pins and slots of
that copy reserved while it is still going, so no other writer is given
them and no reader ever sees bytes another writer put there.

Nothing here imports SGLang.
"""

from __future__ import annotations

import logging
import mmap
import os
import threading
from typing import Any

from kvtier import _daemon
from kvtier.client import Client
from kvtier.client import rpc_message as rpc_msg
from kvtier.v1 import kvtier_pb2 as pb

log = logging.getLogger("kvtier.sglang")

#: Answers of an engine lookup, one byte per key.
UNKNOWN, MISS, HIT = pb.REGION_FOUND_UNKNOWN, pb.REGION_FOUND_MISS, pb.REGION_FOUND_HIT


class Link:
    """One attach. Calls are safe from any thread; ``acquire`` /
    ``release`` bracket every use of the arena."""

    def __init__(self, client: Client, rep: pb.EngineAttachResponse, layout_bytes: int, timeout: float) -> None:
        self.client = client
        # The arena as a torch tensor (storage.py sets it: this module
        # imports no torch), for the pages' copies.
        self.arena_t: Any = None
        self.namespace: str = rep.namespace
        self.epoch: int = int(rep.epoch)
        self.slot_size: int = int(rep.slot_size)
        self.num_slots: int = int(rep.num_slots)
        self._timeout = timeout
        fd, reply = _daemon.receive_arena(rep.fd_socket, self.namespace, rep.ticket, self.epoch)
        try:
            size = int(reply.get("size") or self.slot_size * self.num_slots)
            self._mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        # Fault the mapping in off the hot path: a page's first copy into a
        # slot this process has not touched yet would otherwise take a
        # page fault per 4 KiB (and the kernel's zeroing of a memfd page
        # never used): a third of the copy's speed on the first pass.
        self.populated = threading.Event()
        threading.Thread(target=_populate, args=(self._mm, size, self.populated), name="kvtier-arena-populate",
                         daemon=True).start()
        if self.slot_size < layout_bytes:
            raise ConnectionError(f"namespace {self.namespace} has {self.slot_size}-byte slots, a page is {layout_bytes} bytes")
        self.mu = threading.Lock()  # the free slots and deferred releases
        self._users = _daemon.Users(self._close)
        self.free: list[int] = []  # leased free slots
        # Deferred releases, sent with the next step of this link.
        self.unpins: dict[str, list[bytes]] = {}
        self.finished: list[str] = []

    @property
    def memory(self) -> mmap.mmap:
        return self._mm

    # -- use ---------------------------------------------------------------

    @property
    def down(self) -> bool:
        return self._users.retired

    def acquire(self) -> bool:
        return self._users.acquire()

    def release(self) -> None:
        self._users.release()

    def fail(self, err: BaseException) -> bool:
        """Marks the link down after a failed call (True if it was up);
        closes it once unused."""
        if not self._users.retire():
            return False
        log.warning("kvtier: the daemon did not answer (%s): the backend answers misses until it is back", rpc_msg(err))
        return True

    def shutdown(self) -> None:
        self._users.retire()

    def _close(self) -> None:
        try:
            self.client.close()
        except Exception:  # noqa: BLE001
            pass
        # The mapping is dropped with the last reference to it: a tensor
        # view of it may still be alive in a caller's frame.

    # -- steps -------------------------------------------------------------

    def step(self, req: pb.EngineStepRequest) -> pb.EngineStepResponse:
        """Sends one EngineStep with this link's deferred releases; raises
        on failure. The caller reports a failure with fail(), which takes
        the link down (the deferred releases go with its session)."""
        req.namespace = self.namespace
        req.epoch = self.epoch
        with self.mu:
            unpins, self.unpins = self.unpins, {}
            finished, self.finished = self.finished, []
        for rid, keys in unpins.items():
            req.unpins.add(request_id=rid, packed_keys=b"".join(keys), key_size=len(keys[0]))
        req.finished_request_ids.extend(finished)
        rep = self.client.engine_step(req, timeout=self._timeout)
        for w in rep.warnings:
            log.debug("kvtier: %s", w)
        return rep

    def defer_unpin(self, rid: str, keys: list[bytes]) -> None:
        if keys:
            with self.mu:
                self.unpins.setdefault(rid, []).extend(keys)

    def defer_finish(self, rid: str) -> None:
        with self.mu:
            self.finished.append(rid)

    def has_deferred(self) -> bool:
        with self.mu:
            return bool(self.unpins or self.finished)


_MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)  # Linux 5.14


def _populate(mm: mmap.mmap, size: int, done: threading.Event) -> None:
    step = 64 << 20
    try:
        for off in range(0, size, step):
            mm.madvise(_MADV_POPULATE_WRITE, off, min(step, size - off))
    except (OSError, ValueError) as e:  # an older kernel, or the mapping went away
        log.debug("kvtier: cannot populate the arena mapping: %s", e)
    finally:
        done.set()


def attach(target: str, token: str | None, layout: dict[str, Any], page_bytes: int, timeout: float) -> Link:
    """Attaches the layout on a new connection (the daemon creates the
    namespace if it has none) and maps its arena."""
    c, rep = _daemon.attach(target, token, layout, timeout)
    try:
        if not rep.fd_socket:
            raise ConnectionError("the daemon offers no arena side channel (it needs server.unix_socket)")
        return Link(c, rep, page_bytes, timeout)
    except BaseException:
        c.close()
        raise
