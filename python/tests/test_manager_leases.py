"""Manager mode's lookup leases, on vLLM's own manager interface against a
real daemon: a lease the request does not load is given back after
lease_steps step ends, and only then (the expiry walks the leases that
expire, not every lease held); a loaded lease stays pinned until its load
completes; the lookup fast path follows every change of a request's
answers (a lease given back, a request finished and created again)."""

from __future__ import annotations

import hashlib
import pathlib
import tempfile
import time
from typing import Any, Iterator

import pytest

from conftest import AS_TENANT, Daemon, engine_daemon_config, offloading_config, wait_until

LEASE_STEPS = 3


def key(i: int) -> bytes:
    return hashlib.sha256(b"lease-%d" % i).digest() + b"\0\0\0\0"


@pytest.fixture
def daemon(kvtier_bin: str) -> Iterator[Daemon]:
    d = pathlib.Path(tempfile.mkdtemp(prefix="kvt"))
    dm = Daemon(kvtier_bin, d, engine_daemon_config(d, "1MiB")).start()
    yield dm
    dm.stop()


@pytest.fixture
def mgr(daemon: Daemon) -> Iterator[Any]:
    from vllm.plugins import load_general_plugins
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory

    load_general_plugins()
    spec = OffloadingSpecFactory.create_spec(offloading_config(
        {"spec_name": "KvtierOffloadingSpec", "kvtier": {"target": "unix://" + daemon.sock, "lease_steps": LEASE_STEPS}},
        events=False))
    m = spec.get_manager()
    # With KVTIER_TEST_AS_TENANT the engine is the tenant "suite", in an
    # engine namespace of its own.
    assert m._ns.endswith("~suite") == AS_TENANT, m._ns
    yield m
    m.shutdown()


def step(m: Any) -> None:
    """Ends a step and waits for its call's answer (off the scheduler's
    clock, as the benchmark does)."""
    from vllm.v1.kv_offload.base import ScheduleEndContext

    m.on_schedule_end(ScheduleEndContext(new_req_ids=(), preempted_req_ids=()))
    deadline = time.monotonic() + 10
    while m.has_pending_work() and time.monotonic() < deadline:
        time.sleep(0.001)
        m._drain()


def lookups(m: Any, keys: list[bytes], ctx: Any) -> list[str]:
    return [m.lookup(k, ctx).name for k in keys]


def pinned(daemon: Daemon, m: Any) -> int:
    return int(daemon.client(m._ns).stats().primary.pinned_slots)


def test_unused_leases_expire_after_lease_steps(daemon: Daemon, mgr: Any) -> None:
    from vllm.v1.kv_offload.base import ReqContext

    writer, reader, loader = ReqContext(req_id="w"), ReqContext(req_id="r"), ReqContext(req_id="l")
    for c in (writer, reader, loader):
        mgr.on_new_request(c)
    keys = [key(i) for i in range(4)]
    step(mgr)  # a pool of store slots
    out = mgr.prepare_store(keys, writer)
    assert out is not None and list(out.keys_to_store) == keys
    mgr.complete_store(keys, writer, True)
    step(mgr)

    # The first lookups ask the daemon; the answers are leases, pinned.
    assert lookups(mgr, keys, reader) == ["RETRY"] * 4
    assert lookups(mgr, keys[:2], loader) == ["RETRY"] * 2
    step(mgr)
    assert lookups(mgr, keys, reader) == ["HIT"] * 4
    assert lookups(mgr, keys[:2], loader) == ["HIT"] * 2
    spec = mgr.prepare_load(keys[:2], loader)  # the loader loads its leases
    assert pinned(daemon, mgr) == 4  # slots: keys 0 and 1 pinned twice
    # Held for the lease_steps step ends after the step that saw them...
    for _ in range(LEASE_STEPS):
        step(mgr)
        assert lookups(mgr, keys, reader) == ["HIT"] * 4
        assert pinned(daemon, mgr) == 4  # slots: keys 0 and 1 pinned twice
    # ... then the reader's unused leases go back; the loader's stay.
    step(mgr)
    wait_until(lambda: pinned(daemon, mgr) == 2, 10, "the unused leases to be given back")
    assert lookups(mgr, keys, reader) == ["RETRY"] * 4  # asked again: the fast path saw the leases go
    mgr.complete_load(keys[:2], loader)
    step(mgr)
    assert spec is not None
    assert lookups(mgr, keys, reader) == ["HIT"] * 4
    wait_until(lambda: pinned(daemon, mgr) == 4, 10, "the reader's new leases")

    # A finished request's leases go with it; a new request of the same
    # id starts afresh.
    mgr.on_request_finished(reader)
    step(mgr)
    wait_until(lambda: pinned(daemon, mgr) == 0, 10, "the finished request's leases to be given back")
    again = ReqContext(req_id="r")
    mgr.on_new_request(again)
    assert lookups(mgr, keys, again) == ["RETRY"] * 4
    step(mgr)
    assert lookups(mgr, keys, again) == ["HIT"] * 4


def test_many_leases_cost_no_step_time(daemon: Daemon, mgr: Any) -> None:
    """A step end's work follows the leases that expire, not those held:
    with 64 requests holding 1 000 leases between them, the queue of
    leases is not walked again until they expire."""
    from vllm.v1.kv_offload.base import ReqContext

    w = ReqContext(req_id="w")
    mgr.on_new_request(w)
    keys = [key(100 + i) for i in range(16)]
    step(mgr)
    mgr.prepare_store(keys, w)
    mgr.complete_store(keys, w, True)
    step(mgr)
    reqs = [ReqContext(req_id=f"r{i}") for i in range(64)]
    for c in reqs:
        mgr.on_new_request(c)
        lookups(mgr, keys, c)
    step(mgr)
    assert all(lookups(mgr, keys, c) == ["HIT"] * 16 for c in reqs)
    assert len(mgr._lease_q) == 64 * 16
    step(mgr)
    assert len(mgr._lease_q) == 64 * 16  # nothing expired, nothing walked away
    for _ in range(LEASE_STEPS):
        step(mgr)
    assert len(mgr._lease_q) == 0, len(mgr._lease_q)
    wait_until(lambda: pinned(daemon, mgr) == 0, 10, "every lease given back")


def test_a_short_store_skips_what_the_daemon_holds(daemon: Daemon, mgr: Any) -> None:
    """Issue 40's agent sessions: a store offers a shared prefix the daemon
    already holds (vLLM offers every chunk of a request whose prefix hit
    its GPU cache) and the session's own blocks, more than the pool of
    leased slots. No slot is spent on the prefix, and the own blocks are
    stored whole in the step that offers them (before, the pool went to
    the prefix's copies and vLLM never offered the rest again)."""
    from vllm.v1.kv_offload.base import ReqContext

    shared = [key(200 + i) for i in range(12)]
    first = ReqContext(req_id="first")
    mgr.on_new_request(first)
    step(mgr)
    out = mgr.prepare_store(shared, first)
    assert out is not None and list(out.keys_to_store) == shared
    mgr.complete_store(shared, first, True)
    step(mgr)
    for _ in range(20):  # long enough that the reserve's answers are forgotten
        step(mgr)
    mgr._pool.clear()  # the pool is short again (its slots stay leased on the daemon)
    own = [key(300 + i) for i in range(6)]
    session = ReqContext(req_id="session")
    mgr.on_new_request(session)
    out = mgr.prepare_store(shared + own, session)
    assert out is not None
    assert list(out.keys_to_store) == own, "a slot was spent on a block the daemon holds"
    assert mgr.reserves >= 1 and mgr.reserve_failures == 0
    mgr.complete_store(own, session, True)
    step(mgr)
    reader = ReqContext(req_id="reader")
    mgr.on_new_request(reader)
    lookups(mgr, shared + own, reader)
    step(mgr)
    assert lookups(mgr, shared + own, reader) == ["HIT"] * 18
