"""The daemon link the engines' integrations share.

The vLLM manager mode (``kvtier.vllm.manager``), the vLLM tier mode
(``kvtier.vllm.tier``) and the SGLang backend (``kvtier.sglang``) each hold
a link to a kvtier daemon: one connection — one daemon session, which owns
everything the engine holds there — attached to one epoch of a namespace.
What they do the same way is here:

* ``attach`` opens a connection of its own and attaches an engine's layout
  on it (manager mode, SGLang); it closes the connection when the attach
  fails.
* ``receive_arena`` takes the arena's descriptor from the side channel and
  refuses one of another epoch than the attach named (a daemon that
  restarted in between).
* ``Reattach`` is when to try a daemon that went away again and what to
  say meanwhile: a try every ``interval``, a warning every minute while it
  stays away, debug lines in between, and how long it was away.
* ``Users`` counts the copies still going through a link's slots, and
  closes the link once it is retired (down, replaced, shut) and unused: a
  daemon that was only slow keeps those slots reserved to the copies that
  may still touch them (manager mode and SGLang; in tier mode the daemon
  does the copies).

Each integration keeps what is its own: which thread tries (the manager's
sending thread, the tier's reconnect thread, SGLang's background thread)
and what a down link answers (misses).

Nothing here imports an engine.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping

from kvtier.client import ArenaReply, Client, receive_arena_fd, rpc_message

__all__ = ["DaemonUnavailable", "Reattach", "Users", "attach", "receive_arena", "rpc_message"]
from kvtier.v1 import kvtier_pb2 as pb

#: Seconds between "still unreachable" warnings.
WARN_EVERY = 60.0


class DaemonUnavailable(ConnectionError):
    """The daemon cannot be reached, or serves another epoch than the one
    asked for."""


def attach(target: str, token: str | None, layout: Mapping[str, object],
           timeout: float) -> tuple[Client, pb.EngineAttachResponse]:
    """Attaches layout on a new connection to target; returns the
    connection and the answer. Raises what the call raised (the connection
    closed)."""
    c = Client(target, token=token)
    try:
        return c, c.engine_attach(layout, timeout=timeout)
    except BaseException:
        c.close()
        raise


def receive_arena(fd_socket: str, namespace: str, ticket: str, epoch: int | None) -> tuple[int, ArenaReply]:
    """The arena's descriptor and description from the side channel; with
    epoch, DaemonUnavailable unless the daemon's arena is of that epoch
    (the descriptor closed)."""
    try:
        fd, reply = receive_arena_fd(fd_socket, namespace, ticket)
    except (OSError, RuntimeError) as e:
        raise DaemonUnavailable(f"no arena from the side channel {fd_socket}: {e}") from e
    got = int(reply.get("epoch") or 0)
    if epoch is not None and got and got != epoch:
        os.close(fd)
        raise DaemonUnavailable(f"the daemon serves epoch {got:016x} of namespace {namespace}, not {epoch:016x} "
                                "(it restarted)")
    return fd, reply


class Reattach:
    """The pacing of one outage's attempts to attach again.

    ``start`` marks the daemon gone; ``wait`` says how long until the next
    try; ``failed`` records a try that failed (and warns every
    WARN_EVERY seconds, naming the error); ``back`` ends the outage and
    returns its length. Not thread-safe: one thread tries."""

    def __init__(self, what: str, target: str, interval: float, log: logging.Logger,
                 warn_every: float = WARN_EVERY) -> None:
        self._what = what
        self._target = target
        self.interval = interval
        self._log = log
        self._warn_every = warn_every
        self.since: float | None = None  # when the outage began
        self._next_try = 0.0
        self._next_warn = 0.0

    @property
    def down(self) -> bool:
        return self.since is not None

    def start(self, now: float | None = None, at_once: bool = False) -> None:
        """The daemon went away (nothing if it is known to be): the first
        try comes an interval later, or at once."""
        now = time.monotonic() if now is None else now
        if self.since is None:
            self.since = now
            self._next_try = now if at_once else now + self.interval
            self._next_warn = now + self._warn_every

    def wait(self, now: float | None = None) -> float:
        """Seconds until the next try (0: now)."""
        now = time.monotonic() if now is None else now
        return max(self._next_try - now, 0.0)

    def failed(self, err: BaseException, now: float | None = None) -> None:
        """A try failed: the next one an interval from now."""
        now = time.monotonic() if now is None else now
        self._next_try = now + self.interval
        since = self.since if self.since is not None else now
        if now >= self._next_warn:
            self._next_warn = now + self._warn_every
            self._log.warning("%s: the daemon at %s is still unreachable after %.0fs: %s", self._what, self._target,
                              now - since, rpc_message(err))
        else:
            self._log.debug("%s: attach to %s: %s", self._what, self._target, rpc_message(err))

    def back(self, now: float | None = None) -> float:
        """The daemon is back: returns how long it was away."""
        now = time.monotonic() if now is None else now
        since, self.since = self.since, None
        return now - since if since is not None else 0.0


class Users:
    """The copies still using a link's slots, and whether the link is
    retired (down, replaced or shut down). Once it is retired and no copy
    uses it, on_idle runs, once (it closes the connection: the daemon then
    releases the link's pins and slots, which nothing touches any more).
    Thread-safe; on_idle runs on the thread that made the link idle."""

    def __init__(self, on_idle: Callable[[], None]) -> None:
        self._mu = threading.Lock()
        self._n = 0
        self._retired = False
        self._idle = False
        self._on_idle = on_idle

    @property
    def retired(self) -> bool:
        return self._retired

    def acquire(self, n: int = 1) -> bool:
        """Counts n copies in; False (nothing counted) once retired."""
        with self._mu:
            if self._retired:
                return False
            self._n += n
            return True

    def release(self, n: int = 1) -> None:
        """Counts n copies out."""
        with self._mu:
            self._n -= n
            fire = self._retired and self._n <= 0 and not self._idle
            self._idle = self._idle or fire
        if fire:
            self._on_idle()

    def retire(self) -> bool:
        """Retires the link; True if it was not retired yet."""
        with self._mu:
            was = not self._retired
            self._retired = True
            fire = self._n <= 0 and not self._idle
            self._idle = self._idle or fire
        if fire:
            self._on_idle()
        return was
