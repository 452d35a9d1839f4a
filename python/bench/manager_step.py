"""Scheduler-thread time per engine step in manager mode, against vLLM's
own CPU manager doing the same work in the same run.

A step of 64 running requests: each looks up its 1 000-key prefix (held in
the CPU cache: HIT), stores one new block (prepare_store, then
complete_store) and the step ends. Reported per step, in microseconds,
median of R steps after a warm-up that settles the lookups.

    .venv/bin/python python/bench/manager_step.py --target unix:///tmp/kb/k.sock [--daemon-pid PID]

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


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) process pid has used; 0 without one."""
    if not pid:
        return 0.0
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def runq_wait() -> float:
    """Seconds this thread has waited, runnable, for a CPU
    (/proc/thread-self/schedstat: on-CPU ns, run-queue ns, slices)."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except OSError:
        return 0.0


def run(mgr, name, reqs, prefix, rounds, settle, daemon_pid=0) -> tuple[list[float], list[float], list[float], float]:  # type: ignore[no-untyped-def]
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
    times, cpu, waits = [], [], []
    n = 10_000_000
    d0 = 0.0
    for r in range(rounds + 5):
        if r == 5:
            d0 = proc_cpu(daemon_pid)
        t0, c0, w0 = time.perf_counter(), time.thread_time(), runq_wait()
        for c in reqs:
            for k in prefix:
                mgr.lookup(k, c)
            n += 1
            new = [key(n)]
            o = mgr.prepare_store(new, c)
            if o is not None:
                mgr.complete_store(new, c, True)
        mgr.on_schedule_end(se)
        dt, dc, dw = time.perf_counter() - t0, time.thread_time() - c0, runq_wait() - w0
        if r >= 5:  # the first steps settle the lookups
            times.append(dt)
            cpu.append(dc)
            waits.append(dw)
        settle()
    return times, cpu, waits, (proc_cpu(daemon_pid) - d0) / rounds


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--keys", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--daemon-pid", type=int, default=0, help="report the daemon's CPU per step (its step calls and tier work)")
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

        results[name] = run(mgr, name, reqs, prefix, args.rounds, settle, args.daemon_pid if name == "kvtier" else 0)
        if prefix:
            hits = sum(mgr.lookup(prefix[-1], c).name == "HIT" for c in reqs)
            assert hits == len(reqs), f"{name}: {hits} of {len(reqs)} prefixes HIT"
        mgr.shutdown()
    med = lambda xs: statistics.median(xs) * 1e6  # noqa: E731
    print(f"{args.requests} requests x ({args.keys}-key prefix lookup + 1 store) per step, median of {args.rounds} steps; "
          f"load average {os.getloadavg()[0]:.2f}")
    for name, (t, c, w, d) in results.items():
        per = f"  ({med(t) / (args.requests * args.keys) * 1000:.0f} ns per lookup)" if args.keys else ""
        daemon = f"; daemon cpu {d * 1e6:.0f} us per step" if args.daemon_pid and name == "kvtier" else ""
        print(f"{name:10} wall {med(t):8.0f} us per step (range {min(t) * 1e6:.0f}-{max(t) * 1e6:.0f}), "
              f"thread cpu {med(c):8.0f} us, run-queue wait {med(w):6.0f} us{per}{daemon}")
    (kt, kc, _, _), (vt, vc, _, _) = results["kvtier"], results["vllm-cpu"]
    print(f"ratio kvtier/vllm-cpu: wall {med(kt) / med(vt):.2f}, thread cpu {med(kc) / med(vc):.2f}")


if __name__ == "__main__":
    main()
