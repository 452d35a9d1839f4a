"""The serving benchmark: a real `vllm serve` (vLLM's CPU backend, a
dummy-weight Llama shipped in serving_model/) under a streaming client,
with kvtier and the alternatives a vLLM operator would pick instead.

    scripts/serving-bench.sh [--quick] [--configs a,b] [--rounds N] [--json F] [--plots DIR]

Configurations (--configs; all by default, in --rounds rounds (5), each round
in a fresh random order):

  none            no offloading: vLLM's device (here: CPU KV space) prefix cache only
  cpu             vLLM's OffloadingConnector with its CPU spec (CPUOffloadingSpec)
  vllm-fs         vLLM's TieringOffloadingSpec: its CPU tier with its FS tier behind
  kvtier-tier     kvtier tier mode: vLLM's CPU tier with kvtier (fs behind it) as the secondary tier
  kvtier-manager  kvtier manager mode: kvtier's primary is the CPU cache, its fs tier behind
  kvtier-router   kvtier-manager with a router in the client: when it queues a request for an
                  engine it asks the daemon to prefetch the request's prefix (keys from its token
                  ids, kvtier.keys), while the request waits for a free slot
  lmcache         LMCache's multiprocess server (CPU, then local disk) with vLLM's LMCacheMPConnector

and, with --engines 2 (default: 1 and 2), the offloading configurations
again with two engines behind a round-robin client: each engine has its own
CPU cache under cpu and vllm-fs (vllm-fs engines share the FS directory, as
they would share a volume), and one daemon serves both under kvtier (in
manager mode one shared CPU primary of both engines' budgets).

Every configuration gets the same DRAM budget per engine (--cpu-share of
the workload's distinct prompt KV) and the same device cache (--device-share).
Each workload (--workloads: mooncake, the Mooncake conversation trace,
scaled; document, many users asking about one long document; no-reuse,
prompts that share nothing; agent, sessions with one system prompt and
growing histories, turns interleaved; documents, several documents asked
round-robin, larger together than a device cache; burst, 64 requests at one
instant, half on a cached prefix) runs on fresh servers in every
configuration; the client sends requests in order, --concurrency per engine
in flight (the burst: all at once), and times each streamed response.
Each kvtier / alternative ratio of p50 TTFT is reported as the median over
rounds with a bootstrap 90 % interval, paired by round. Hit tokens by source come from the engines'
Prometheus counters (vllm:prompt_tokens_cached_by_source) and, for kvtier,
the daemon's per-tier counters.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable

import serving_client as client
import serving_procs as procs
import serving_workload as wl
from serving_report import Run, ms, ratios, table, targets

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
# The whole trace where the project's shared data sits beside it, else the
# first 2 000 requests the tree carries.
_FULL_TRACE = ROOT.parent / "shared" / "data" / "mooncake_conversation_trace.jsonl"
TRACE = pathlib.Path(os.environ.get("KVTIER_TRACE") or (
    _FULL_TRACE if _FULL_TRACE.exists() else ROOT / "workload" / "testdata" / "mooncake_conversation_2000.jsonl.gz"))
MODEL_DIR = HERE / "serving_model"
CONFIGS = ("none", "cpu", "vllm-fs", "kvtier-tier", "kvtier-manager", "kvtier-router", "lmcache")
WORKLOADS = ("mooncake", "document", "no-reuse", "agent", "documents", "burst")
# What vLLM's external_unspecified source means per configuration.
EXTERNAL = {"kvtier-manager": "kvtier", "kvtier-router": "kvtier", "kvtier-tier": "kvtier", "lmcache": "lmcache"}
# Configurations whose daemon runs kvtier manager mode.
MANAGER = ("kvtier-manager", "kvtier-router")


@dataclasses.dataclass
class Setup:
    """What every run shares."""

    work: pathlib.Path
    kvtier_bin: str
    vllm_python: str
    lmcache_python: str
    model: pathlib.Path
    block_tokens: int
    kv_bytes_per_token: int
    concurrency: int
    timeout: float
    startup_timeout: float
    speedup: float  # 0: closed loop; else arrivals at the trace's times / speedup
    bind_one: str  # VLLM_CPU_OMP_THREADS_BIND of a lone engine
    bind_two: tuple[str, str]  # of each of two engines
    keep_logs: bool

    def bind(self, engines: int, i: int) -> str:
        return self.bind_one if engines == 1 else self.bind_two[i % 2]


# ---------------------------------------------------------------- servers


class Stack:
    """The servers of one run: the cache process (kvtier daemon or LMCache
    server) if the configuration has one, and the engines."""

    def __init__(self, s: Setup, run: Run, dir: pathlib.Path) -> None:
        self.s, self.run, self.dir = s, run, dir
        self.procs: list[procs.Proc] = []
        self.engines: list[tuple[str, int]] = []
        self.daemon_metrics: tuple[str, int] | None = None
        self.daemon_target = ""  # the kvtier daemon's API, for the router
        self.cache_proc: procs.Proc | None = None  # the kvtier daemon or the LMCache server
        # What the run's engines share (vLLM's FS tier directory, as engines
        # would share a volume).
        self.shared = dir

    def start(self) -> None:
        t0 = time.monotonic()
        extra = self._cache()
        ktc = None if extra is None else json.dumps({
            "kv_connector": extra.pop("_connector", "OffloadingConnector"), "kv_role": "kv_both",
            "kv_connector_extra_config": extra})
        py = self.s.lmcache_python if self.run.config == "lmcache" else self.s.vllm_python
        starting = []
        for i in range(self.run.engines):
            port = procs.free_port()
            argv = [py, "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.s.model), "--load-format", "dummy",
                    "--skip-tokenizer-init", "--enforce-eager", "--dtype", "bfloat16", "--seed", "0",
                    "--host", "127.0.0.1", "--port", str(port), "--max-model-len", str(self.run.max_model_len),
                    "--block-size", str(self.s.block_tokens), "--enable-prefix-caching",
                    "--num-gpu-blocks-override", str(self.run.device_blocks), "--enable-prompt-tokens-details"]
            if ktc is not None:
                argv += ["--kv-transfer-config", ktc]
            env = procs.quiet_env(VLLM_CPU_OMP_THREADS_BIND=self.s.bind(self.run.engines, i), VLLM_CPU_KVCACHE_SPACE="1")
            p = procs.Proc(f"vllm serve #{i}", argv, self.dir / f"vllm{i}.log", env=env, cwd=self.dir)
            self.procs.append(p)
            starting.append((p, port))
        for p, port in starting:
            p.wait_ready(procs.http_ok(f"http://127.0.0.1:{port}/health"), self.s.startup_timeout)
            self.engines.append(("127.0.0.1", port))
        self.run.startup_s = time.monotonic() - t0

    def _cache(self) -> dict[str, Any] | None:
        """Starts the configuration's cache process and returns the engines'
        kv_connector_extra_config, with the connector's name under
        "_connector" where it is not the OffloadingConnector (None: no
        connector)."""
        c, budget = self.run.config, self.run.cpu_bytes
        if c == "none":
            return None
        # vLLM's own CPUOffloadingSpec and TieringOffloadingSpec refuse the
        # CPU backend ("CPU Offloading is currently only supported on
        # CUDA-alike and XPU GPUs"): their managers (the CPU LRU cache, the
        # FS tier) run here under KvtierTieringOffloadingSpec, which is
        # vLLM's TieringOffloadingSpec with a host-memory copy worker in
        # place of the CUDA one, and nothing of kvtier's cache in the path.
        if c == "cpu":
            return {"spec_name": "KvtierTieringOffloadingSpec", "spec_module_path": "kvtier.vllm",
                    "cpu_bytes_to_use": budget, "secondary_tiers": []}
        if c == "vllm-fs":
            return {"spec_name": "KvtierTieringOffloadingSpec", "spec_module_path": "kvtier.vllm",
                    "cpu_bytes_to_use": budget,
                    "secondary_tiers": [{"type": "fs", "root_dir": str(self.shared / "vllm-fs")}]}
        if c in ("kvtier-tier", *MANAGER):
            target = self._daemon(budget * self.run.engines if c in MANAGER else 64 << 20)
            if c == "kvtier-tier":
                return {"spec_name": "KvtierTieringOffloadingSpec", "spec_module_path": "kvtier.vllm",
                        "cpu_bytes_to_use": budget, "secondary_tiers": [{"type": "kvtier", "target": target}]}
            return {"spec_name": "KvtierOffloadingSpec", "spec_module_path": "kvtier.vllm",
                    "kvtier": {"target": target, "lookup_timeout_s": 5}}
        if c == "lmcache":
            port = self._lmcache(budget * self.run.engines)
            return {"_connector": "LMCacheMPConnector", "lmcache.mp.host": "tcp://127.0.0.1", "lmcache.mp.port": port}
        raise ValueError(f"unknown configuration {c!r}")

    def _daemon(self, primary_bytes: int) -> str:
        """A kvtier daemon: a primary of primary_bytes per engine layout
        (manager mode; tier mode does not use it), an fs tier behind."""
        sock = self.dir / "k.sock"
        port = procs.free_port()
        cfg = self.dir / "kvtier.yaml"
        cfg.write_text(f"""
namespace: {{model: serving-bench, bytes_per_block: 4KiB}}
primary: {{bytes: 0}}
engines: {{primary_bytes: {primary_bytes}}}
secondary_tiers:
  - {{name: disk, type: fs, root_dir: {self.dir}/kvtier-fs, locality: local}}
server: {{unix_socket: {sock}, tcp_addr: "", metrics_addr: "127.0.0.1:{port}", shutdown_timeout: 20s}}
""")
        p = procs.Proc("kvtier serve", [self.s.kvtier_bin, "serve", "--config", str(cfg)], self.dir / "kvtier.log")
        self.procs.append(p)
        self.cache_proc = p
        p.wait_ready(procs.log_contains(p, "kvtier API listening"), 30)
        self.daemon_metrics = ("127.0.0.1", port)
        self.daemon_target = str(sock)
        return "unix://" + str(sock)

    def _lmcache(self, cpu_bytes: int) -> int:
        port = procs.free_port()
        http_port = procs.free_port()
        argv = [self.s.lmcache_python, "-m", "lmcache.cli.main", "server", "--host", "127.0.0.1", "--port", str(port),
                "--supported-transfer-mode", "engine_driven", "--chunk-size", str(self.s.block_tokens),
                "--l1-size-gb", f"{cpu_bytes / (1 << 30):.4f}", "--eviction-policy", "LRU", "--http-host", "127.0.0.1", "--http-port", str(http_port),
                # Its disk tier, like every other configuration's.
                "--l2-adapter", json.dumps({"type": "fs", "base_path": str(self.dir / "lmcache-fs")})]
        p = procs.Proc("lmcache server", argv, self.dir / "lmcache.log", env=procs.quiet_env(), cwd=self.dir)
        self.procs.append(p)
        self.cache_proc = p
        p.wait_ready(procs.log_contains(p, "cache server is running"), self.s.startup_timeout)
        return port

    def stop(self) -> None:
        for p in reversed(self.procs):
            p.stop()


def scrape_all(stack: Stack) -> dict[str, float]:
    tot: dict[str, float] = {}
    for host, port in stack.engines:
        for k, v in client.scrape(host, port).items():
            tot[k] = tot.get(k, 0.0) + v
    return tot


def daemon_tier_tokens(stack: Stack, block_tokens: int) -> dict[str, float]:
    """Tokens the daemon promoted from each of its tiers, summed over
    namespaces (tier mode registers one per engine)."""
    if stack.daemon_metrics is None:
        return {}
    m = client.scrape(*stack.daemon_metrics)
    slot = [v for k, v in m.items() if k.startswith("kvtier_primary_slot_bytes")]
    slot_bytes = max(slot) if slot else 0
    out: dict[str, float] = {}
    for k, v in m.items():
        if k.startswith("kvtier_tier_bytes_total") and "direction=in" in k and slot_bytes:
            tier = k.split("tier=")[1].split(",")[0].rstrip("}")
            out[tier] = out.get(tier, 0.0) + v / slot_bytes * block_tokens
    return out


SOURCES = ("device", "host", "disk", "p2p", "external_unspecified")


# vLLM's offloading counters a run reports (what issue 46 compares between
# a secondary tier and vLLM's own): store allocations and promotion
# allocations that failed, and the time requests waited on deferred
# lookups (the sum and count of vLLM's histogram).
OFFLOAD_COUNTERS = {
    "allocation_failures": "vllm:kv_offload_allocation_failure_total",
    "promotion_allocation_failures": "vllm:kv_offload_tiering_promotion_allocation_failures_total",
    "lookup_deferred_s": "vllm:kv_offload_lookup_async_delay_seconds_sum",
    "lookup_deferrals": "vllm:kv_offload_lookup_async_delay_seconds_count",
}


def offload_counters(d: dict[str, float]) -> dict[str, float]:
    """vLLM's offloading counters of a run (OFFLOAD_COUNTERS), from the
    change of its /metrics over the run; absent ones are left out."""
    out = {}
    for name, metric in OFFLOAD_COUNTERS.items():
        vals = [v for k, v in d.items() if k == metric or k.startswith(metric + "{")]
        if vals:
            out[name] = sum(vals)
    return out


def hit_tokens(config: str, d: dict[str, float]) -> dict[str, int]:
    out = {}
    for src in SOURCES:
        n = int(d.get(f"vllm:prompt_tokens_cached_by_source_total{{source={src}}}", 0))
        if n:
            name = {"host": "cpu", "external_unspecified": EXTERNAL.get(config, "external")}.get(src, src)
            out[name] = out.get(name, 0) + n
    return out


def execute(s: Setup, runs: list[Run], workloads: list[wl.Workload], log: Callable[[str], None]) -> None:
    """Runs every workload, in turn, on one stack of fresh servers for the
    configuration of runs (one Run per workload)."""
    head = runs[0]
    dir = pathlib.Path(tempfile.mkdtemp(prefix=f"{head.config}-{head.engines}-", dir=s.work))
    stack = Stack(s, head, dir)
    failed = False
    try:
        stack.start()
        log(f"  {head.label}: {head.engines} engine(s) up in {head.startup_s:.0f}s")
        # One request of its own per engine first: the first request of a
        # fresh server pays for lazy initialisation, not for its prompt.
        warm = wl.Request(tuple(range(16, 16 + 2 * s.block_tokens)), 2, "warmup")
        for host, port in stack.engines:
            r = client.complete(host, port, str(s.model), warm, s.timeout)
            if r.error:
                raise RuntimeError(f"warm-up request failed: {r.error}")
        for run, workload in zip(runs, workloads):
            run.startup_s = head.startup_s
            measure(s, stack, run, workload, log)
            failed = failed or bool(run.error)
        if s.keep_logs:
            for i, (host, port) in enumerate(stack.engines):
                (dir / f"vllm{i}-metrics.txt").write_text(client.scrape_text(host, port))
            if stack.daemon_metrics:
                (dir / "kvtier-metrics.txt").write_text(client.scrape_text(*stack.daemon_metrics))
    except Exception as e:  # a configuration that cannot run is reported, the others go on
        failed = True
        for run in runs:
            if not run.results and not run.error:
                run.error = f"{type(e).__name__}: {e}"
        log(f"  {head.label}: FAILED: {type(e).__name__}: {str(e)[:2000]}")
    finally:
        stack.stop()
        if not failed and not s.keep_logs:
            shutil.rmtree(dir, ignore_errors=True)
        else:
            log(f"  logs kept in {dir}")


class Router:
    """What a KV-aware router does once it has assigned a request to a
    node: it asks that node's daemon to prefetch the request's prefix
    (kvtier.Client.prefetch, keys from the token ids with kvtier.keys),
    while the request waits in its queue for a free slot (the client's
    closed loop: at most --concurrency in flight per engine). One daemon
    serves every engine of a run, so the node does not matter here. One
    call per request, timed; a failed call is counted, never fatal."""

    def __init__(self, target: str, block_tokens: int) -> None:
        import kvtier

        from kvtier.keys import keys_from_tokens

        self.block_tokens = block_tokens
        self.c = kvtier.Client(target)
        self.lock = threading.Lock()
        self.calls = self.failed = self.started = self.present = 0
        self.call_s = 0.0
        # Warm, as a router is before it routes: vLLM's hashing imported,
        # the connection up.
        keys_from_tokens(list(range(block_tokens)), block_size=block_tokens)
        self.c.stats()

    def prefetch(self, req: wl.Request, server: int = 0) -> None:
        from kvtier.keys import keys_from_tokens

        t0 = time.monotonic()
        try:
            keys = keys_from_tokens(req.prompt, block_size=self.block_tokens)
            a = self.c.prefetch(keys, deadline_ms=5000) if keys else None
        except Exception:  # a router must not fail the request
            with self.lock:
                self.failed += 1
            return
        with self.lock:
            self.calls += 1
            self.call_s += time.monotonic() - t0
            if a is not None:
                self.started += a.started
                self.present += a.present

    def counters(self) -> dict[str, float]:
        return {"router_prefetch_calls": self.calls, "router_prefetch_failed": self.failed,
                "router_promotions_started": self.started, "router_keys_present": self.present,
                "router_call_ms_mean": round(1000 * self.call_s / self.calls, 3) if self.calls else 0.0}

    def close(self) -> None:
        self.c.close()


def measure(s: Setup, stack: Stack, run: Run, workload: wl.Workload, log: Callable[[str], None]) -> None:
    before, dbefore = scrape_all(stack), daemon_tier_tokens(stack, s.block_tokens)
    cpu0 = stack.cache_proc.cpu_seconds() if stack.cache_proc else 0.0
    router = Router(stack.daemon_target, s.block_tokens) if run.config == "kvtier-router" else None
    try:
        run.results, run.wall_s = client.replay(stack.engines, str(s.model), workload.requests,
                                                concurrency=s.concurrency * run.engines, timeout=s.timeout,
                                                speedup=s.speedup or (1.0 if workload.open_loop else 0.0),
                                                on_assign=router.prefetch if router else None)
    finally:
        if router:
            run.offload.update(router.counters())
            router.close()
    if stack.cache_proc:
        # The cache process's CPU time: on a small machine it is taken from
        # the engines' compute.
        run.cache_cpu_s = stack.cache_proc.cpu_seconds() - cpu0
    moved = client.delta(before, scrape_all(stack))
    run.hit_tokens = hit_tokens(run.config, moved)
    run.offload = {**offload_counters(moved), **run.offload}
    dafter = daemon_tier_tokens(stack, s.block_tokens)
    run.kvtier_tiers = {k: int(v - dbefore.get(k, 0.0)) for k, v in dafter.items() if v - dbefore.get(k, 0.0) > 0}
    if run.config in MANAGER:
        # What the engines loaded from kvtier that no tier promoted came
        # from its primary.
        run.kvtier_tiers = {"primary": max(run.hit_tokens.get("kvtier", 0) - sum(run.kvtier_tiers.values()), 0),
                            **run.kvtier_tiers}
    bad = [r for r in run.results if r.error]
    if bad:
        log(f"  {run.label}, {workload.name}: {len(bad)} of {len(run.results)} requests failed, e.g. {bad[0].error}")
    sm = run.summary()
    log(f"  {run.label}, {workload.name}: p50 TTFT {ms(sm['ttft_p50_s'])}, hit share {sm['hit_share'] or 0:.3f} "
        f"in {run.wall_s:.0f}s; " + (", ".join(f"{k} {v:g}" for k, v in run.offload.items()) or "no offloading counters"))


# ---------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated configurations (default: all)")
    ap.add_argument("--engines", default="1,2", help="engine counts to run (2: offloading configurations only)")
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma-separated, of {', '.join(WORKLOADS)}")
    ap.add_argument("--rounds", type=int, default=0,
                    help="rounds over all configurations, each in a fresh random order (default 5; 1 with --quick)")
    ap.add_argument("--quick", action="store_true", help="a small workload, for the test suite")
    ap.add_argument("--conversations", type=int, default=14, help="Mooncake conversations sampled")
    ap.add_argument("--max-requests", type=int, default=0, help="cut the Mooncake workload to this many requests")
    ap.add_argument("--tokens-per-hash", type=int, default=64, help="tokens per trace block (512 in production)")
    ap.add_argument("--max-tokens", type=int, default=16, help="tokens generated per request (at most)")
    ap.add_argument("--concurrency", type=int, default=2, help="requests in flight per engine (closed loop)")
    ap.add_argument("--speedup", type=float, default=0.0,
                    help="send requests at their arrival times divided by this (the trace's, the document's 2 s apart); "
                         "0 (default): a closed loop of --concurrency per engine")
    ap.add_argument("--cpu-share", type=float, default=0.25, help="CPU cache per engine, as a share of the distinct prompt KV")
    ap.add_argument("--device-share", type=float, default=0.1, help="device cache, as a share of the distinct prompt KV")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", help="write every run's results here")
    ap.add_argument("--plots", help="draw the charts into this directory (kvtier bench plot-serving)")
    ap.add_argument("--plot-bin", default="",
                    help="a kvtier built with -tags charts, which draws them (default: --kvtier-bin; "
                         "scripts/serving-bench.sh builds its kvtier so)")
    ap.add_argument("--kvtier-bin", default=os.environ.get("KVTIER_BIN", ""))
    ap.add_argument("--vllm-python", default=os.environ.get("KVTIER_VLLM_CPU_PYTHON", str(ROOT / ".venv-cpu/bin/python")))
    ap.add_argument("--lmcache-python", default=os.environ.get("KVTIER_LMCACHE_PYTHON", str(ROOT / ".venv-lmcache/bin/python")))
    ap.add_argument("--work", help="scratch directory (default: a new temporary one, removed at the end)")
    ap.add_argument("--bind-one", default="", help="VLLM_CPU_OMP_THREADS_BIND of a lone engine (default: every core)")
    ap.add_argument("--bind-two", default="", help="of each of two engines, |-separated (default: half the cores each)")
    ap.add_argument("--keep-logs", action="store_true", help="keep every run's server logs under --work")
    ap.add_argument("--startup-timeout", type=float, default=600)
    a = ap.parse_args(argv)

    configs = [c for c in a.configs.split(",") if c]
    if bad := [c for c in configs if c not in CONFIGS]:
        ap.error(f"unknown configuration(s) {', '.join(bad)}: want some of {', '.join(CONFIGS)}")
    engines = sorted({int(x) for x in a.engines.split(",") if x})
    if not engines or min(engines) < 1 or max(engines) > 2:
        ap.error("--engines: want 1, 2 or 1,2")
    workloads_wanted = [w for w in a.workloads.split(",") if w]
    if bad := [w for w in workloads_wanted if w not in WORKLOADS]:
        ap.error(f"unknown workload(s) {', '.join(bad)}: want some of {', '.join(WORKLOADS)}")
    if a.rounds == 0:
        a.rounds = 1 if a.quick else 5
    if a.rounds < 1:
        ap.error("--rounds: want >= 1")
    if "mooncake" in workloads_wanted and not TRACE.is_file():
        ap.error(f"the Mooncake trace {TRACE} is not a file (set KVTIER_TRACE)")
    if a.speedup < 0:
        ap.error("--speedup: want > 0, or 0 for a closed loop")
    if not a.kvtier_bin and any(c.startswith("kvtier") for c in configs):
        ap.error("--kvtier-bin (or KVTIER_BIN) names no kvtier binary")
    for name, py in (("--vllm-python", a.vllm_python),) + ((("--lmcache-python", a.lmcache_python),) if "lmcache" in configs else ()):
        if not os.access(py, os.X_OK):
            ap.error(f"{name} {py}: not an interpreter (scripts/serving-bench.sh sets the environments up)")

    model_cfg = json.loads((MODEL_DIR / "config.json").read_text())
    kv_per_token = (model_cfg["num_hidden_layers"] * 2 * model_cfg["num_key_value_heads"]
                    * model_cfg.get("head_dim", model_cfg["hidden_size"] // model_cfg["num_attention_heads"]) * 2)
    block = 64
    max_len = 3072
    if a.quick:
        # Short prompts and one request in flight: the device cache is then
        # small next to the working set, and offloading has work to do.
        a.conversations, a.max_requests, a.max_tokens, a.concurrency, max_len = 3, 8, 4, 1, 1024
        a.cpu_share = max(a.cpu_share, 0.5)
    work = pathlib.Path(a.work) if a.work else pathlib.Path(tempfile.mkdtemp(prefix="kvtier-serving-"))
    work.mkdir(parents=True, exist_ok=True)
    # vLLM reads the model directory; a copy keeps the tree clean of
    # anything it writes next to it.
    model = work / "model"
    shutil.copytree(MODEL_DIR, model, dirs_exist_ok=True)
    ncpu = os.cpu_count() or 1
    # One engine gets every core; two split them, so that their OpenMP
    # threads (which spin) do not take turns on the same cores.
    half = max(ncpu // 2, 1)
    bind_one = a.bind_one or f"0-{ncpu - 1}"
    two = a.bind_two.split("|") if a.bind_two else ([bind_one] * 2 if ncpu < 2 else [f"0-{half - 1}", f"{half}-{ncpu - 1}"])
    if len(two) != 2:
        ap.error("--bind-two: want two CPU lists separated by |, e.g. 0-3|4-7")
    s = Setup(work=work, kvtier_bin=a.kvtier_bin, vllm_python=a.vllm_python, lmcache_python=a.lmcache_python,
              model=model, block_tokens=block, kv_bytes_per_token=kv_per_token,
              concurrency=a.concurrency, timeout=300, startup_timeout=a.startup_timeout,
              speedup=a.speedup, bind_one=bind_one, bind_two=(two[0], two[1]), keep_logs=a.keep_logs)
    vocab = model_cfg["vocab_size"]
    workloads: list[wl.Workload] = []
    if "mooncake" in workloads_wanted:
        workloads.append(wl.mooncake(TRACE, conversations=a.conversations, tokens_per_hash=a.tokens_per_hash,
                                     max_blocks=(max_len - a.max_tokens) // a.tokens_per_hash - 1, max_tokens=a.max_tokens,
                                     vocab=vocab, seed=a.seed, max_requests=a.max_requests))
    if "document" in workloads_wanted:
        if a.quick:
            workloads.append(wl.document(users=2, questions=2, doc_tokens=512, question_tokens=32, noise=1,
                                         max_tokens=a.max_tokens, vocab=vocab, seed=a.seed))
        else:
            workloads.append(wl.document(users=8, questions=3, doc_tokens=1536, question_tokens=64, noise=4,
                                         max_tokens=a.max_tokens, vocab=vocab, seed=a.seed))
    # The synthetic workloads' sizes: --quick keeps them to a few requests.
    q = a.quick
    if "no-reuse" in workloads_wanted:
        workloads.append(wl.no_reuse(requests=4 if q else 24, prompt_tokens=256 if q else 1024, max_tokens=a.max_tokens,
                                     vocab=vocab, seed=a.seed))
    if "agent" in workloads_wanted:
        workloads.append(wl.agent(sessions=2 if q else 10, turns=2 if q else 4, system_tokens=128 if q else 512,
                                  turn_tokens=64 if q else 128, max_tokens=a.max_tokens, vocab=vocab, seed=a.seed))
    if "documents" in workloads_wanted:
        workloads.append(wl.documents(documents=2 if q else 6, questions=2 if q else 4, doc_tokens=256 if q else 1536,
                                      question_tokens=32 if q else 64, max_tokens=a.max_tokens, vocab=vocab, seed=a.seed))
    if "burst" in workloads_wanted:
        workloads.append(wl.burst(requests=4 if q else 64, prefix_tokens=256 if q else 512, suffix_tokens=64,
                                  max_tokens=a.max_tokens, vocab=vocab, seed=a.seed))

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    # Every round runs the configurations in a fresh random order (seeded,
    # and logged), so that a drift of the machine over a round (a warming
    # disk, another process) does not always favour the same ones.
    plan: list[tuple[int, str, int]] = []
    order_rng = random.Random(a.seed)
    for rnd in range(1, a.rounds + 1):
        this = [(rnd, c, n) for n in engines for c in configs if not (n > 1 and c == "none")]  # two engines without offloading share nothing
        order_rng.shuffle(this)
        plan += this
    log(f"serving benchmark: {len(plan)} server stacks, {len(workloads)} workload(s) each; "
        f"load average {os.getloadavg()[0]:.2f} on {ncpu} cores")
    # One sizing for every workload of a stack: the CPU cache a share of the
    # largest workload's distinct prompt KV, the engine's context its
    # longest request, its device cache the requests in flight.
    distinct = max(w.unique_tokens(block) for w in workloads)
    longest = max(-(-(len(r.prompt) + r.max_tokens) // block) for w in workloads for r in w.requests)
    device = max(int(distinct * a.device_share) // block, (longest + 1) * a.concurrency)
    cpu_bytes = max(int(distinct * a.cpu_share), block) * kv_per_token
    for w in workloads:
        u = w.unique_tokens(block)
        log(f"  workload {w.name}: {len(w.requests)} requests, {w.prompt_tokens()} prompt tokens, {u} distinct "
            f"({u * kv_per_token / (1 << 20):.0f} MiB of KV)")
    log(f"  CPU cache per engine {cpu_bytes / (1 << 20):.1f} MiB ({cpu_bytes // kv_per_token} tokens), device cache "
        f"{device} blocks of {block} tokens, context {longest * block} tokens")
    runs: list[Run] = []
    t0 = time.monotonic()
    for rnd, c, n in plan:
        group = [Run(config=c, engines=n, workload=w.name, round=rnd, cpu_bytes=cpu_bytes, device_blocks=device,
                     max_model_len=longest * block) for w in workloads]
        log(f"round {rnd}, {group[0].label} ({time.monotonic() - t0:.0f}s in; load {os.getloadavg()[0]:.2f})")
        execute(s, group, workloads, log)
        runs += group
    runs.sort(key=lambda r: (r.workload != workloads[0].name, r.round, r.engines))
    print(table(runs))
    rs = ratios(runs, seed=a.seed)
    for x in rs:
        print(f"{x['workload']} ({x['engines']} engine(s)): {x['config']} / {x['against']} p50 TTFT: median {x['median']:.2f} "
              f"over {x['rounds']} round(s), 90% interval {x['lo']:.2f}-{x['hi']:.2f}; per round "
              + ", ".join(f"{v:.2f}" for v in x["per_round"]))
    for w in workloads:
        for n in engines:
            for c in configs:
                rr = [r for r in runs if (r.workload, r.engines, r.config) == (w.name, n, c) and r.offload]
                if rr:
                    keys = sorted({k for r in rr for k in r.offload})
                    print(f"{w.name} ({n} engine(s)) {c}: vLLM's offloading counters per round: " + "; ".join(
                        f"{k} {[round(r.offload.get(k, 0.0), 3) for r in rr]}" for k in keys))
    tg = targets(runs)
    for t in tg:
        print(f"{t['workload']}: {t['target']}: {'met' if t['met'] else 'NOT met'} "
              f"(ratio {t['ratio']:.2f} against {t['against']})" if t["ratio"] is not None else
              f"{t['workload']}: {t['target']}: {'met' if t['met'] else 'NOT met'}")
    doc = {
        "machine": {"cpus": ncpu, "platform": platform.platform(), "python": sys.version.split()[0],
                    "load_avg_end": os.getloadavg()},
        "setup": {"model": model_cfg, "kv_bytes_per_token": kv_per_token, "block_tokens": block, "speedup": a.speedup,
                  "concurrency_per_engine": a.concurrency, "cpu_share": a.cpu_share, "device_share": a.device_share,
                  "tokens_per_hash": a.tokens_per_hash, "max_tokens": a.max_tokens, "seed": a.seed,
                  "workloads": {w.name: {"requests": len(w.requests), "prompt_tokens": w.prompt_tokens(),
                                         "distinct_tokens": w.unique_tokens(block)} for w in workloads}},
        "runs": [r.to_json() for r in runs], "ratios": rs, "targets": tg, "seconds": time.monotonic() - t0,
        "order": [f"{rnd}:{c}x{n}" for rnd, c, n in plan],
    }
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(doc, indent=1))
    if a.plots:
        plot_bin = a.plot_bin or a.kvtier_bin
        if not plot_bin:
            log("--plots needs --plot-bin or --kvtier-bin")
            return 2
        subprocess.run([plot_bin, "bench", "plot-serving", "--out", a.plots, "-"], input=json.dumps(doc),
                       text=True, check=True)
    if not a.work:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if any(r.error or r.summary()["failed"] for r in runs if r.config != "lmcache") else 0


if __name__ == "__main__":
    sys.exit(main())
