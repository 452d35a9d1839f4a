"""Manager mode through vLLM's real scheduler: kvtier's primary is the CPU
cache of two engines attached to one daemon. Engine 2 hits the prefix
engine 1 stored; a cache reset empties the primary, and blocks reloaded
from the disk tier after it are the bytes the "model" computed; kvtier's
Stats show the hits."""

from __future__ import annotations

import pathlib
import tempfile
from typing import Iterator

import pytest

from conftest import Daemon, engine_daemon_config
from engine_harness import BLOCK, Engine, tiny_model_dir

PROMPT = list(range(300, 300 + 4 * BLOCK + 5))


@pytest.fixture
def engine_daemon(kvtier_bin: str) -> Iterator[Daemon]:
    d = pathlib.Path(tempfile.mkdtemp(prefix="kvt"))
    dm = Daemon(kvtier_bin, d, engine_daemon_config(d, "1MiB")).start()
    yield dm
    dm.stop()


def engine(daemon: Daemon, model: str) -> Engine:
    from vllm.plugins import load_general_plugins

    load_general_plugins()  # registers spec_name KvtierOffloadingSpec
    return Engine({"spec_name": "KvtierOffloadingSpec", "kvtier": {"target": "unix://" + daemon.sock}}, model=model)


def test_two_engines_share_one_cpu_cache(engine_daemon: Daemon) -> None:
    model = tiny_model_dir()  # one model: the engines' layouts match
    e1, e2 = engine(engine_daemon, model), engine(engine_daemon, model)
    try:
        ns = e1.manager._ns
        assert e2.manager._ns == ns
        e1.add("a", PROMPT)
        e1.run()
        # Engine 2 never computed this prefix: it loads it from the shared cache.
        e2.add("a", PROMPT)  # the same request id: ids are per engine
        e2.run()
        assert e2.reused["a"] == (4, 4), e2.reused["a"]
        with engine_daemon.client(ns) as c:
            st = c.stats()
        assert st.primary.hits >= 4, st.primary
        # A reset drops the shared primary's blocks no one holds: a request
        # that may load from the primary only computes its prefix again
        # (the reset travels with its first lookups, and comes first).
        e1.reset_prefix_cache()
        e1.add("b", PROMPT, {"kv_load_tiers": []})  # the primary is never filtered
        e1.run()
        assert e1.reused["b"] == (0, 0), e1.reused["b"]
        # After the next reset the prefix comes back from kvtier's disk
        # tier, byte for byte.
        e1.reset_prefix_cache()
        e1.add("c", PROMPT)
        e1.run()
        assert e1.reused["c"] == (4, 4), e1.reused["c"]
    finally:
        e1.shutdown()
        e2.shutdown()


def test_a_prompt_larger_than_the_slot_pool_is_stored(engine_daemon: Daemon) -> None:
    """A prompt with more blocks than the engine's pool of leased store
    slots is stored whole in the step that offers it: the manager leases
    the slots it lacks in one bounded call (EngineReserve). Its first
    request generates one token, so vLLM offers its blocks only once more;
    waiting for the step end's lease would lose them."""
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    model = tiny_model_dir()
    cfg = {"spec_name": "KvtierOffloadingSpec", "kvtier": {"target": "unix://" + engine_daemon.sock, "min_free_slots": 1}}
    e1, e2 = Engine(cfg, model=model), Engine(cfg, model=model)
    try:
        first = list(range(1000, 1000 + 8 * BLOCK + 5))
        e1.add("a", first)
        e1.run()
        assert e1.manager.store_shortfalls >= 1 and e1.manager.reserves >= 1
        e2.add("a", first)
        e2.run()
        assert e2.reused["a"] == (8, 8), e2.reused["a"]
        second = list(range(3000, 3000 + 8 * BLOCK + 5))
        e1.add("b", second)
        e1.run()
        e2.add("b", second)
        e2.run()
        assert e2.reused["b"] == (8, 8), e2.reused["b"]
    finally:
        e1.shutdown()
        e2.shutdown()


def test_steps_that_store_nothing_keep_the_pool(engine_daemon: Daemon) -> None:
    """Decode steps and idle spins store nothing; they must not shrink the
    slot pool below what the last prefill needed, or the next such prompt
    would be stored only in part."""
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    model = tiny_model_dir()
    cfg = {"spec_name": "KvtierOffloadingSpec", "kvtier": {"target": "unix://" + engine_daemon.sock, "min_free_slots": 1}}
    e1, e2 = Engine(cfg, model=model), Engine(cfg, model=model)
    try:
        e1.add("a", list(range(1000, 1000 + 8 * BLOCK + 5)))
        e1.run()
        for _ in range(40):  # more than the pool remembers steps
            e1.step()
        e1.run()
        shortfalls = e1.manager.store_shortfalls
        second = list(range(3000, 3000 + 8 * BLOCK + 5))
        e1.add("b", second)
        e1.run()
        assert e1.manager.store_shortfalls == shortfalls
        e2.add("b", second)
        e2.run()
        assert e2.reused["b"] == (8, 8), e2.reused["b"]
    finally:
        e1.shutdown()
        e2.shutdown()


def _steps_until_scheduled(e: Engine, rid: str, prompt: list[int]) -> int:
    """Engine steps from a request's arrival to its first scheduled step.
    Between steps the daemon's answers to the step's calls are let in (as
    during a forward pass), so the count is steps, not the machine's speed."""
    import time

    m = e.manager
    e.add(rid, prompt)
    for n in range(1, 50):
        e.step()
        if rid in e.reused:
            return n
        deadline = time.monotonic() + 10
        while getattr(m, "_in_flight", 0) and time.monotonic() < deadline:
            time.sleep(0.001)
            m._drain()
    raise AssertionError(f"{rid} not scheduled in 50 steps")


def test_a_miss_and_a_primary_hit_are_answered_in_the_asking_step(engine_daemon: Daemon) -> None:
    """Issue 40: a new request's lookups are answered in the step that asks
    (the first-sight call), HIT and MISS alike, as vLLM's own CPU manager
    answers from its memory: a miss is scheduled in its first step, a hit
    as soon as vLLM's load of it is done, in as many steps as with vLLM's
    CPU manager. Before, every answer came one engine step late."""
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    model = tiny_model_dir()
    # vLLM's CPU manager: its tiering spec with no secondary tier (on
    # kvtier's host-copy worker, as vLLM builds none on the CPU backend).
    cpu = Engine({"spec_name": "KvtierTieringOffloadingSpec", "spec_module_path": "kvtier.vllm", "cpu_bytes_to_use": 4 << 20,
                  "secondary_tiers": []}, model=model)
    try:
        cpu_miss = _steps_until_scheduled(cpu, "m", list(range(5000, 5000 + 4 * BLOCK + 3)))
        cpu.add("w", list(range(6000, 6000 + 4 * BLOCK + 3)))
        cpu.run()
        # Off the device, still in vLLM's CPU cache.
        assert cpu.scheduler.reset_prefix_cache(reset_connector=False)
        cpu_hit = _steps_until_scheduled(cpu, "h", list(range(6000, 6000 + 4 * BLOCK + 3)))
        assert cpu.reused["h"] == (4, 4), cpu.reused["h"]
    finally:
        cpu.shutdown()
    e1, e2 = engine(engine_daemon, model), engine(engine_daemon, model)
    # The count is of steps, not time: a busy machine must not turn a first
    # sight into a timeout.
    e2.manager._call_bound = 30.0
    try:
        prompt = list(range(7000, 7000 + 4 * BLOCK + 3))
        e1.add("w", prompt)
        e1.run()
        miss = _steps_until_scheduled(e2, "m", list(range(9000, 9000 + 4 * BLOCK + 3)))
        hit = _steps_until_scheduled(e2, "h", prompt)  # in the daemon's primary, never on e2's device
        assert e2.reused["h"] == (4, 4), e2.reused["h"]
        assert e2.manager.first_sights >= 2 and e2.manager.first_sight_failures == 0
    finally:
        e1.shutdown()
        e2.shutdown()
    print(f"steps to first schedule: vLLM CPU manager miss {cpu_miss}, CPU hit {cpu_hit}; "
          f"kvtier manager mode miss {miss}, primary hit {hit}")
    assert (miss, hit) == (cpu_miss, cpu_hit), (miss, hit, cpu_miss, cpu_hit)


def test_promotions_start_at_first_sight(engine_daemon: Daemon) -> None:
    """Issue 40: when the engine first asks about a request whose prefix
    is on kvtier's disk tier only, every block of the prefix starts its
    promotion in that step's call, not only the block vLLM asked about,
    and not a step later."""
    import time

    from conftest import wait_until

    model = tiny_model_dir()
    e1, e2 = engine(engine_daemon, model), engine(engine_daemon, model)
    e2.manager._call_bound = 30.0  # steps are counted, not time (a busy machine)
    try:
        prompt = list(range(11_000, 11_000 + 8 * BLOCK + 5))
        e1.add("w", prompt)
        e1.run()
        ns = e1.manager._ns
        wait_until(lambda: engine_daemon.tier_stats(ns)["disk"].cascades_ok >= 1, 20, "the prefix on disk")
        # Drop the daemon's primary (the reset travels with a step of e1).
        e1.reset_prefix_cache()
        e1.add("flush", [7, 7, 7])
        e1.run()
        before = engine_daemon.tier_stats(ns)["disk"].hits
        t0 = time.monotonic()
        e2.add("r", prompt)
        e2.step()  # the asking step: its first-sight call looked the prefix up
        hits = engine_daemon.tier_stats(ns)["disk"].hits - before
        assert e2.manager.first_sights >= 1
        assert hits == 8, f"{hits} of the prefix's 8 blocks found on disk in the asking step"
        e2.run()
        assert e2.reused["r"] == (8, 8), e2.reused["r"]
        print(f"a disk-only prefix of 8 blocks: all promoted from the asking step; scheduled after {time.monotonic() - t0:.3f}s")
    finally:
        e1.shutdown()
        e2.shutdown()
