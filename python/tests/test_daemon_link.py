"""kvtier._daemon, the link the three integrations share: Users closes a
link once, when it is retired and unused; Reattach paces its tries and
warns once a minute while the daemon stays away."""

from __future__ import annotations

import logging
import random
import threading

import pytest

from kvtier import _daemon


def test_users_closes_once_retired_and_unused() -> None:
    closed: list[int] = []
    u = _daemon.Users(lambda: closed.append(1))
    assert u.acquire(2)
    assert u.retire()          # two copies still going: not closed
    assert not u.retire()      # already retired
    assert not u.acquire()     # no new copy on a retired link
    u.release()
    assert closed == []
    u.release()
    assert closed == [1]
    u.release()                # a stray release closes nothing again
    assert closed == [1]


def test_users_retired_unused_closes_at_once() -> None:
    closed: list[int] = []
    u = _daemon.Users(lambda: closed.append(1))
    u.retire()
    assert closed == [1]


def test_users_model_threads() -> None:
    """Random acquires and releases on threads, one retire: on_idle runs
    exactly once, after the last copy of the link is out."""
    for seed in range(20):
        rng = random.Random(seed)
        closed: list[int] = []
        live = [0]
        mu = threading.Lock()

        def idle() -> None:
            with mu:
                assert live[0] == 0, "closed while a copy was still going"
            closed.append(1)

        u = _daemon.Users(idle)

        def worker(n: int) -> None:
            for _ in range(n):
                if not u.acquire():
                    return
                with mu:
                    live[0] += 1
                with mu:
                    live[0] -= 1
                u.release()

        ts = [threading.Thread(target=worker, args=(rng.randrange(50, 200),)) for _ in range(4)]
        for t in ts:
            t.start()
        u.retire()
        for t in ts:
            t.join()
        assert closed == [1]


def test_reattach_paces_and_warns_once_a_minute(caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("kvtier.test")
    r = _daemon.Reattach("kvtier test", "unix:///nowhere", 1.0, log)
    r.start(now=100.0)
    assert r.down
    assert r.wait(now=100.0) == 1.0          # the first try an interval later
    r2 = _daemon.Reattach("kvtier test", "unix:///nowhere", 1.0, log)
    r2.start(now=100.0, at_once=True)
    assert r2.wait(now=100.0) == 0.0
    with caplog.at_level(logging.DEBUG, logger="kvtier.test"):
        for t in range(101, 200):             # a try a second for 99 s
            assert r.wait(now=float(t)) == 0.0
            r.failed(ConnectionError("refused"), now=float(t))
            assert r.wait(now=float(t)) == 1.0
    warnings = [rec for rec in caplog.records if rec.levelno == logging.WARNING]
    assert len(warnings) == 1 and "still unreachable after 60s" in warnings[0].getMessage()
    assert r.back(now=200.0) == 100.0
    assert not r.down
