"""Tier mode through vLLM's real scheduler: requests whose kv_transfer_params
carry kv_load_tiers / kv_store_tiers reach kvtier's filters, and blocks
reloaded after a prefix-cache reset are the bytes the "model" computed."""

from __future__ import annotations

from typing import Any

from conftest import Daemon
from engine_harness import BLOCK, Engine


def engine(daemon: Daemon, cpu_chunks: int = 32) -> Engine:
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    page = 2 * BLOCK * 2 * 16 * 2  # bytes per layer per block
    return Engine({
        "spec_name": "KvtierTieringOffloadingSpec", "spec_module_path": "kvtier.vllm",
        "cpu_bytes_to_use": cpu_chunks * 2 * page,
        "secondary_tiers": [{"type": "kvtier", "target": "unix://" + daemon.sock}],
    })


PROMPT = list(range(100, 100 + 4 * BLOCK + 3))  # four full blocks and a tail


def test_store_reset_reload_through_the_scheduler(daemon: Daemon) -> None:
    e = engine(daemon)
    try:
        tier = e.manager.secondary_tiers[0]
        e.add("a", PROMPT, {"kv_store_tiers": [{"medium": "storage"}]})
        e.run()
        ns = tier.namespace
        st = daemon.tier_stats(ns)
        assert st["disk"].cascades_ok >= 1 and st["dram"].cascades_ok == 0, st

        # Forget everything vLLM holds (GPU prefix cache and CPU primary):
        # the prefix can only come back from kvtier's disk.
        e.reset_prefix_cache()
        e.add("b", PROMPT, {"kv_load_tiers": [{"medium": "storage", "locality": "local"}]})
        e.run()
        good, reused = e.reused["b"]
        assert reused == 4 and good == 4, f"{good} of {reused} reloaded blocks hold the computed bytes"
        assert daemon.tier_stats(ns)["disk"].hits >= 1

        # kv_load_tiers without storage: kvtier's disk is not asked; the
        # prefix is computed again.
        e.reset_prefix_cache()
        before = daemon.tier_stats(ns)["disk"]
        e.add("c", PROMPT, {"kv_load_tiers": [{"medium": "cpu"}]})
        e.run()
        after = daemon.tier_stats(ns)["disk"]
        assert e.reused["c"] == (0, 0), e.reused["c"]
        assert (after.hits, after.misses, after.retries) == (before.hits, before.misses, before.retries)
        assert after.skipped_by_filter > before.skipped_by_filter
    finally:
        e.shutdown()
