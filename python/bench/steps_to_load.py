"""Engine steps from a request's arrival to its first scheduled step, for a
miss, a hit in the CPU cache and a prefix only on disk: kvtier's manager
mode (the daemon's primary, its fs tier) and tier mode (kvtier's fs tier
behind vLLM's CPU tier) against vLLM's own CPU manager and CPU+FS tiering,
through vLLM's real scheduler and connector (the model-less engine of
python/tests/engine_harness.py).

The serving benchmark's TTFT on a disk hit is this many engine steps of
other requests' work; on vLLM's CPU backend a step that prefills is tens
to hundreds of milliseconds, so every step counts.

    KVTIER_BIN=/path/to/kvtier .venv/bin/python python/bench/steps_to_load.py [--step-ms 5] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

from conftest import Daemon, engine_daemon_config, wait_until  # noqa: E402
from engine_harness import BLOCK, Engine, tiny_model_dir  # noqa: E402


def steps_until_scheduled(e: Engine, rid: str, prompt: list[int], step_s: float) -> tuple[int, float, tuple[int, int]]:
    e.add(rid, prompt)
    t0 = time.monotonic()
    for n in range(1, 2000):
        e.step()
        if rid in e.reused:
            return n, time.monotonic() - t0, e.reused[rid]
        time.sleep(step_s)  # the step's model time
    raise RuntimeError(f"{rid} never scheduled")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--step-ms", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    step_s = a.step_ms / 1000
    model = tiny_model_dir()
    results: dict[str, list[tuple[int, float, tuple[int, int]]]] = {
        name: [] for name in ("vllm-cpu miss", "vllm-cpu cpu hit", "vllm-fs miss", "vllm-fs disk hit", "kvtier-manager miss",
                              "kvtier-manager cpu hit", "kvtier-manager disk hit", "kvtier-tier miss", "kvtier-tier disk hit")}
    d = pathlib.Path(tempfile.mkdtemp(prefix="kvt"))
    daemon = Daemon(os.environ["KVTIER_BIN"], d, engine_daemon_config(d, "4MiB")).start()
    # Tier mode on a daemon of its own: one daemon's namespaces of the same
    # layout in both modes would share (and lock) one fs directory.
    d2 = pathlib.Path(tempfile.mkdtemp(prefix="kvt"))
    tdaemon = Daemon(os.environ["KVTIER_BIN"], d2, engine_daemon_config(d2, "4MiB")).start()
    try:
        for rnd in range(a.rounds):
            prompt = list(range(1000 + 100 * rnd, 1000 + 100 * rnd + 8 * BLOCK + 5))
            # vLLM's tiering: engine 1 stores to its CPU cache and its FS
            # tier; engine 2, sharing the FS directory, has an empty CPU
            # cache and finds the prefix on disk.
            fs = {"spec_name": "KvtierTieringOffloadingSpec", "spec_module_path": "kvtier.vllm", "cpu_bytes_to_use": 4 << 20,
                  "secondary_tiers": [{"type": "fs", "root_dir": str(d / "vllm-fs")}]}
            # vLLM's CPU manager: its tiering spec with no secondary tier; a
            # hit in its CPU cache after the device's prefix cache was reset.
            cpu = {"spec_name": "KvtierTieringOffloadingSpec", "spec_module_path": "kvtier.vllm", "cpu_bytes_to_use": 4 << 20,
                   "secondary_tiers": []}
            e = Engine(cpu, model=model)
            try:
                results["vllm-cpu miss"].append(steps_until_scheduled(e, "m", [p + 50_000 for p in prompt], step_s))
                e.add("w", prompt)
                e.run()
                assert e.scheduler.reset_prefix_cache(reset_connector=False)
                results["vllm-cpu cpu hit"].append(steps_until_scheduled(e, "r", prompt, step_s))
            finally:
                e.shutdown()
            e1, e2 = Engine(fs, model=model), Engine(fs, model=model)
            try:
                e1.add("w", prompt)
                e1.run()
                results["vllm-fs disk hit"].append(steps_until_scheduled(e2, "r", prompt, step_s))
                results["vllm-fs miss"].append(steps_until_scheduled(e2, "m", [p + 50_000 for p in prompt], step_s))
            finally:
                e1.shutdown()
                e2.shutdown()
            # kvtier manager mode: engine 1 stores into the daemon; once the
            # blocks are on the daemon's disk tier its primary is reset, and
            # engine 2 finds the prefix on disk only.
            mm = {"spec_name": "KvtierOffloadingSpec", "kvtier": {"target": "unix://" + daemon.sock}}
            e1, e2 = Engine(mm, model=model), Engine(mm, model=model)
            try:
                e1.add("w", prompt)
                e1.run()
                # A third engine finds it in the daemon's primary (never on
                # its device; engine 2 must not compute it before its disk hit).
                e3 = Engine(mm, model=model)
                try:
                    results["kvtier-manager cpu hit"].append(steps_until_scheduled(e3, "c", prompt, step_s))
                finally:
                    e3.shutdown()
                ns = e1.manager._ns
                wait_until(lambda: daemon.tier_stats(ns)["disk"].cascades_ok >= rnd + 1, 20, "cascades")
                time.sleep(0.2)
                e1.reset_prefix_cache()
                e1.add("flush", [7, 7, 7])  # carries the reset to the daemon
                e1.run()
                results["kvtier-manager disk hit"].append(steps_until_scheduled(e2, "r", prompt, step_s))
                results["kvtier-manager miss"].append(steps_until_scheduled(e2, "m", [p + 50_000 for p in prompt], step_s))
            finally:
                e1.shutdown()
                e2.shutdown()
            # kvtier tier mode: engine 1 stores through vLLM's CPU tier to
            # kvtier's fs tier; engine 2 (an empty CPU cache) finds it there.
            tm = {"spec_name": "KvtierTieringOffloadingSpec", "spec_module_path": "kvtier.vllm", "cpu_bytes_to_use": 4 << 20,
                  "secondary_tiers": [{"type": "kvtier", "target": "unix://" + tdaemon.sock}]}
            tprompt = [p + 200_000 for p in prompt]
            e1, e2 = Engine(tm, model=model), Engine(tm, model=model)
            try:
                e1.add("w", tprompt)
                e1.run()
                tns = e1.manager.secondary_tiers[0].namespace
                wait_until(lambda: tdaemon.tier_stats(tns)["disk"].cascades_ok >= rnd + 1, 20, "tier-mode cascades")
                results["kvtier-tier disk hit"].append(steps_until_scheduled(e2, "r", tprompt, step_s))
                results["kvtier-tier miss"].append(steps_until_scheduled(e2, "m", [p + 50_000 for p in tprompt], step_s))
            finally:
                e1.shutdown()
                e2.shutdown()
    finally:
        daemon.stop()
        tdaemon.stop()
    for name, rs in results.items():
        steps = [r[0] for r in rs]
        ms = [r[1] * 1000 for r in rs]
        print(f"{name}: steps to first schedule {steps} (median {statistics.median(steps)}), "
              f"ms {[round(x, 1) for x in ms]} (median {statistics.median(ms):.1f}), reused {[r[2] for r in rs]}")


if __name__ == "__main__":
    main()
