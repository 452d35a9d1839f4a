"""The manager's link to the daemon: step calls in order, on one thread,
and attaching again when the daemon went away (``KvtierProxyManager``'s
docstring says what the scheduler does meanwhile).

``Sender`` owns the sending thread. The scheduler thread posts a step's
batch (``post``) tagged with the link generation it was built for; the
thread sends batches of the current generation one at a time and puts
every answer, in order, on ``answers``: an ``Answer`` per batch (its
response, its error, or *stale* when its link was down already). When a
call fails the thread attaches again every ``reconnect_interval_s``
(``kvtier._daemon.Reattach``), answering batches stale meanwhile, and
puts an ``Attached`` with the new link, whose generation is one more; the
scheduler switches to it between steps. Old connections are closed on
this thread too (``close``), once the scheduler knows no transfer uses
their slots.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvtier import _daemon

if TYPE_CHECKING:
    from kvtier.client import Client
    from kvtier.v1 import kvtier_pb2 as pb

log = logging.getLogger("kvtier.vllm")

_ABSENT = object()


@dataclass
class Link:
    """One attach: a connection (a daemon session) and the epoch of the
    namespace it attached to."""

    gen: int
    client: Client
    namespace: str
    epoch: int
    num_slots: int


@dataclass
class Answer:
    gen: int
    req: pb.EngineStepRequest
    lookups: dict[str, list[bytes]]
    rep: pb.EngineStepResponse | None = None
    err: BaseException | None = None
    stale: bool = False      # not sent: its link was down already


@dataclass
class Late:
    """The answer of a call the scheduler thread stopped waiting for (a
    first sight, a reserve) that the daemon carried out after all: what it
    took there (lookup leases, leased slots) is given back."""

    gen: int
    rid: str
    keys: list[bytes]  # a first sight's keys, co-indexed with its answer
    rep: Any


@dataclass
class Attached:
    link: Link
    old_client: Client
    down_for: float


@dataclass
class _Close:
    clients: list[Client]


#: A step's batch: the link generation it is for, the request, and the
#: keys of its lookups by request id.
_Batch = tuple[int, "pb.EngineStepRequest", dict[str, list[bytes]]]


class Sender:
    def __init__(self, link: Link, attach: Callable[[int], Link], timeout: float, reconnect_interval: float,
                 target: str) -> None:
        self._attach = attach
        self._timeout = timeout
        self._reconnect_interval = reconnect_interval
        self._target = target
        self._out: queue.SimpleQueue[_Batch | _Close | None] = queue.SimpleQueue()
        #: Answers in the order the batches went, attaches and late answers.
        self.answers: queue.SimpleQueue[Answer | Attached | Late] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, args=(link,), name="kvtier-step", daemon=True)
        self._thread.start()

    def post(self, gen: int, req: pb.EngineStepRequest, lookups: dict[str, list[bytes]]) -> None:
        self._out.put((gen, req, lookups))

    def close(self, clients: list[Client]) -> None:
        """Closes connections on the sending thread, after what it sends."""
        self._out.put(_Close(clients))

    def stop(self) -> None:
        """Ends the thread (it closes the current connection) within the
        call timeout."""
        self._out.put(None)
        self._thread.join(self._timeout)

    def _loop(self, link: Link | None) -> None:
        while True:
            item = self._out.get()
            if item is None:
                break
            if isinstance(item, _Close):
                close_all(item.clients)
                continue
            gen, req, lookups = item
            if link is None or gen != link.gen:
                self.answers.put(Answer(gen, req, lookups, stale=True))
                continue
            try:
                rep = link.client.engine_step(req, timeout=self._timeout)
            except Exception as e:  # noqa: BLE001 - a failed step must not kill the scheduler
                self.answers.put(Answer(gen, req, lookups, err=e))
                try:
                    link = self._reattach(link, e)
                except Exception:  # noqa: BLE001 - this thread must outlive anything
                    log.exception("kvtier: attaching again failed unexpectedly; the engine serves without kvtier")
                    link = None  # every later batch is answered stale
                continue
            self.answers.put(Answer(gen, req, lookups, rep=rep))
        if link is not None:
            close_all([link.client])

    def _reattach(self, old: Link, err: BaseException) -> Link | None:
        """Attaches again every reconnect_interval_s until it succeeds
        (returns the new link) or the manager shuts down (None). Batches
        that arrive meanwhile are answered stale."""
        log.warning("kvtier: the daemon at %s did not answer a step (%s): lookups answer MISS and stores are skipped "
                    "until it is back; attaching again every %gs", self._target, _daemon.rpc_message(err),
                    self._reconnect_interval)
        again = _daemon.Reattach("kvtier", self._target, self._reconnect_interval, log)
        again.start()
        while True:
            item: _Batch | _Close | object | None
            try:
                item = self._out.get(timeout=again.wait())
            except queue.Empty:
                item = _ABSENT
            if item is None:
                self._out.put(None)
                close_all([old.client])
                return None
            if isinstance(item, _Close):
                close_all(item.clients)
                continue
            if isinstance(item, tuple):
                gen, req, lookups = item
                self.answers.put(Answer(gen, req, lookups, stale=True))
                continue
            try:
                link = self._attach(old.gen + 1)
            except Exception as e:  # noqa: BLE001
                again.failed(e)
                continue
            self.answers.put(Attached(link, old.client, again.back()))
            return link


def close_all(clients: Iterable[Client]) -> None:
    for c in clients:
        try:
            c.close()
        except Exception:  # noqa: BLE001
            pass
