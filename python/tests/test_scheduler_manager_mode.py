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
