"""Scheduler-thread time of kvtier's tier per engine step, against vLLM's
own FS tier doing the same work in the same run.

One step of a request whose prefix is N keys (default 1 000): vLLM's
manager looks every key up in the secondary tier (the prefix scan goes on
through RETRY) and ends the step. The first step of a request answers RETRY
for every key (both tiers batch the existence checks off the thread); the
benchmark then waits for the answers and times the second step, which
answers from the tier's cache. Reported per step, in microseconds, as the
median of R rounds (fresh requests each round).

    .venv/bin/python python/bench/tier_step.py --target unix:///tmp/k/k.sock

Needs a running `kvtier serve` whose config has an fs tier.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
sys.path.insert(0, os.path.dirname(__file__))


from vllm.v1.kv_offload.base import LookupResult, RequestOffloadingContext  # noqa: E402
from vllm.v1.kv_offload.tiering.base import SecondaryTierManager  # noqa: E402


class NoopTier(SecondaryTierManager):
    def lookup(self, key, req_context):  # type: ignore[no-untyped-def]
        return LookupResult.MISS

    def submit_store(self, job_metadata):  # type: ignore[no-untyped-def]
        pass

    def submit_load(self, job_metadata):  # type: ignore[no-untyped-def]
        pass

    def get_finished_jobs(self):  # type: ignore[no-untyped-def]
        return ()

    def on_new_request(self, req_context):  # type: ignore[no-untyped-def]
        return RequestOffloadingContext()

    def drain_jobs(self) -> None:
        pass


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--keys", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args()

    from conftest import offloading_config
    from vllm.plugins import load_general_plugins
    from vllm.v1.kv_offload.base import ReqContext, ScheduleEndContext
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory

    load_general_plugins()
    root = tempfile.mkdtemp(prefix="vllm-fs")
    tiers = {
        "kvtier": {"type": "kvtier", "target": args.target},
        "vllm-fs": {"type": "fs", "root_dir": root},
        # The floor: a tier whose lookup only returns (the cost of vLLM
        # calling a Python tier once per key).
        "no-op": {"type": "NoopTier", "module_path": "tier_step"},
    }
    se = ScheduleEndContext(new_req_ids=(), preempted_req_ids=())
    keys = [hashlib.sha256(b"%d" % i).digest() + b"\0\0\0\0" for i in range(args.keys)]
    results: dict[str, dict[str, list[float]]] = {}
    for name, tier_cfg in tiers.items():
        spec = OffloadingSpecFactory.create_spec(offloading_config(
            {"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": 16 * 4096, "secondary_tiers": [tier_cfg]}, events=False))
        mgr = spec.get_manager()
        tier = mgr.secondary_tiers[0]
        first, second = [], []
        for r in range(args.rounds):
            ctx = ReqContext(req_id=f"{name}-{r}")
            tier.on_new_request(ctx)
            t0 = time.perf_counter()
            for k in keys:
                tier.lookup(k, ctx)
            tier.on_schedule_end(se)
            first.append(time.perf_counter() - t0)
            # Wait (untimed) until the answers are in.
            deadline = time.monotonic() + 10
            while name != "no-op" and tier.lookup(keys[-1], ctx).name == "RETRY" and time.monotonic() < deadline:
                time.sleep(0.001)
                tier.on_schedule_end(se)
            t0 = time.perf_counter()
            for k in keys:
                tier.lookup(k, ctx)
            tier.get_finished_jobs()
            tier.on_schedule_end(se)
            second.append(time.perf_counter() - t0)
            tier.on_request_finished(ctx)
        mgr.shutdown()
        results[name] = {"first": first, "second": second}
    med = lambda xs: statistics.median(xs) * 1e6  # noqa: E731
    print(f"{args.keys}-key request, median of {args.rounds} rounds, scheduler-thread µs per step")
    print(f"{'tier':10} {'first step':>12} {'second step':>12}")
    for name, r in results.items():
        print(f"{name:10} {med(r['first']):12.0f} {med(r['second']):12.0f}")
    k, v = results["kvtier"], results["vllm-fs"]
    print(f"ratio kvtier/vllm-fs: first {med(k['first']) / med(v['first']):.2f}, second {med(k['second']) / med(v['second']):.2f}")


if __name__ == "__main__":
    main()
