"""Scheduler-thread time per engine step in manager mode, against vLLM's
own CPU manager doing the same work in the same run.

A step of 64 running requests: each looks up its 1 000-key prefix (held in
the CPU cache: HIT), stores one new block (prepare_store, then
complete_store) and the step ends. Reported per step, in microseconds,
median of R steps after a warm-up that settles the lookups.

    .venv/bin/python python/bench/manager_step.py --target unix:///tmp/kb/k.sock

Needs a running `kvtier serve` with engines on (engines.primary_bytes of
at least 64 MiB).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))


def key(i: int) -> bytes:
    return hashlib.sha256(b"%d" % i).digest() + b"\0\0\0\0"


def run(mgr, name, reqs, prefix, rounds, settle) -> list[float]:  # type: ignore[no-untyped-def]
    from vllm.v1.kv_offload.base import ScheduleEndContext

    se = ScheduleEndContext(new_req_ids=(), preempted_req_ids=())
    # The prefix, stored once, in steps of 100 blocks.
    c0 = reqs[0]
    for i in range(0, len(prefix), 100):
        part = prefix[i:i + 100]
        for _ in range(100):
            out = mgr.prepare_store(part, c0)
            if out is not None:
                break
            mgr.on_schedule_end(se)  # the pool of store slots grows
            settle()
        assert out is not None, name
        mgr.complete_store(part, c0, True)
        mgr.on_schedule_end(se)
        settle()
    times = []
    n = 10_000_000
    for r in range(rounds + 5):
        t0 = time.perf_counter()
        for c in reqs:
            for k in prefix:
                mgr.lookup(k, c)
            n += 1
            new = [key(n)]
            o = mgr.prepare_store(new, c)
            if o is not None:
                mgr.complete_store(new, c, True)
        mgr.on_schedule_end(se)
        dt = time.perf_counter() - t0
        if r >= 5:  # the first steps settle the lookups
            times.append(dt)
        settle()
    return times


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--keys", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args()

    from conftest import offloading_config
    from vllm.plugins import load_general_plugins
    from vllm.v1.kv_offload.base import ReqContext
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory

    load_general_plugins()
    prefix = [key(i) for i in range(args.keys)]
    blocks = args.keys + args.requests * (args.rounds + 10)
    results = {}
    for name, extra in {
        "kvtier": {"spec_name": "KvtierOffloadingSpec", "kvtier": {"target": args.target, "lease_steps": 1 << 30, "min_free_slots": 4 * args.requests}},
        "vllm-cpu": {"spec_name": "CPUOffloadingSpec", "cpu_bytes_to_use": blocks * 4096},
    }.items():
        spec = OffloadingSpecFactory.create_spec(offloading_config(extra, events=False))
        mgr = spec.get_manager()
        reqs = [ReqContext(req_id=f"{name}-{i}") for i in range(args.requests)]
        for c in reqs:
            mgr.on_new_request(c)

        def settle() -> None:
            # Off the clock: let the step's call come back.
            deadline = time.monotonic() + 10
            while mgr.has_pending_work() and time.monotonic() < deadline:
                time.sleep(0.0005)
                if hasattr(mgr, "_drain"):
                    mgr._drain()

        results[name] = run(mgr, name, reqs, prefix, args.rounds, settle)
        if prefix:
            hits = sum(mgr.lookup(prefix[-1], c).name == "HIT" for c in reqs)
            assert hits == len(reqs), f"{name}: {hits} of {len(reqs)} prefixes HIT"
        mgr.shutdown()
    med = lambda xs: statistics.median(xs) * 1e6  # noqa: E731
    print(f"{args.requests} requests x ({args.keys}-key prefix lookup + 1 store) per step, median of {args.rounds} steps")
    for name, t in results.items():
        per = f"  ({med(t) / (args.requests * args.keys) * 1000:.0f} ns per lookup)" if args.keys else ""
        print(f"{name:10} {med(t):10.0f} us per step{per}")
    print(f"ratio kvtier/vllm-cpu: {med(results['kvtier']) / med(results['vllm-cpu']):.2f}")


if __name__ == "__main__":
    main()
