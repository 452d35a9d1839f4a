"""The serving benchmark (python/bench/serving.py, scripts/serving-bench.sh)
in its --quick form: a real `vllm serve` on the CPU backend, two engines
behind one kvtier daemon in manager mode, four of its workloads (the burst
as an open loop); the harness
reports every request answered and tokens served from kvtier, and draws its
charts. The workload builders are checked on their own, without a server."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import tempfile

from test_cpu_backend import cpu_python

BENCH = pathlib.Path(__file__).resolve().parents[1] / "bench"
ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(BENCH))

import serving_client as client  # noqa: E402
import serving_report as report  # noqa: E402
import serving_workload as wl  # noqa: E402

# The trace's first 2 000 requests, in the tree.
TRACE = pathlib.Path(__file__).resolve().parents[2] / "workload" / "testdata" / "mooncake_conversation_2000.jsonl.gz"


def test_mooncake_workload_keeps_the_traces_prefix_sharing(tmp_path: pathlib.Path) -> None:
    trace = tmp_path / "t.jsonl"
    rows = [
        {"timestamp": 0, "input_length": 1024, "output_length": 10, "hash_ids": [0, 1]},
        {"timestamp": 5, "input_length": 1536, "output_length": 10, "hash_ids": [0, 1, 2]},
        {"timestamp": 9, "input_length": 600, "output_length": 10, "hash_ids": [0, 3]},
        {"timestamp": 12, "input_length": 1100, "output_length": 10, "hash_ids": [0, 3, 4]},
        {"timestamp": 20, "input_length": 512, "output_length": 10, "hash_ids": [0, 5]},  # one turn: left out
    ]
    trace.write_text("\n".join(json.dumps(r) for r in rows))
    w = wl.mooncake(trace, conversations=10, tokens_per_hash=8, max_blocks=8, max_tokens=4, vocab=512, seed=3)
    assert len(w.requests) == 4
    by_group: dict[str, list[wl.Request]] = {}
    for r in w.requests:
        by_group.setdefault(r.group, []).append(r)
    assert sorted(len(v) for v in by_group.values()) == [2, 2]
    first, second = by_group["conv1"]
    assert len(first.prompt) == 16 and len(second.prompt) == 24  # 8 tokens per 512-token block
    assert second.prompt[:16] == first.prompt  # the shared blocks are the same tokens
    a, b = by_group["conv3"]
    assert a.prompt[:8] == first.prompt[:8]  # the system prompt, block 0, is shared by all
    assert a.prompt[8:16] != first.prompt[8:16]
    assert len(a.prompt) == 10  # 600 of 1024 tokens: the partial block kept in proportion
    assert all(r.max_tokens == 4 for r in w.requests)
    again = wl.mooncake(trace, conversations=10, tokens_per_hash=8, max_blocks=8, max_tokens=4, vocab=512, seed=3)
    assert again == w  # deterministic


def test_document_workload_shares_one_document() -> None:
    w = wl.document(users=3, questions=2, doc_tokens=64, question_tokens=8, noise=1, max_tokens=2, vocab=512, seed=1)
    users = [r for r in w.requests if r.group.startswith("user")]
    assert len(users) == 6 and len(w.requests) == 8
    assert len({r.prompt[:64] for r in users}) == 1
    assert len({r.prompt for r in users}) == 6
    assert w.unique_tokens(8) == 64 + 6 * 8 + 2 * 72


def test_no_reuse_prompts_share_no_block() -> None:
    w = wl.no_reuse(requests=5, prompt_tokens=64, max_tokens=2, vocab=512, seed=1)
    assert len(w.requests) == 5
    assert w.unique_tokens(8) == 5 * 64  # no two prompts share even their first block


def test_agent_sessions_grow_and_interleave() -> None:
    w = wl.agent(sessions=3, turns=3, system_tokens=32, turn_tokens=8, max_tokens=2, vocab=512, seed=1)
    assert [r.group for r in w.requests[:4]] == ["session0", "session1", "session2", "session0"]
    system = w.requests[0].prompt[:32]
    assert all(r.prompt[:32] == system for r in w.requests)
    by: dict[str, list[wl.Request]] = {}
    for r in w.requests:
        by.setdefault(r.group, []).append(r)
    for turns in by.values():
        for a, b in zip(turns, turns[1:]):
            assert b.prompt[:len(a.prompt)] == a.prompt and len(b.prompt) == len(a.prompt) + 8
    assert w.requests[0].prompt[32:40] != w.requests[1].prompt[32:40]  # each session's history is its own


def test_documents_round_robin_and_burst_arrives_at_once() -> None:
    w = wl.documents(documents=3, questions=2, doc_tokens=64, question_tokens=8, max_tokens=2, vocab=512, seed=1)
    assert [r.group for r in w.requests] == ["doc0", "doc1", "doc2"] * 2
    assert w.requests[0].prompt[:64] == w.requests[3].prompt[:64] != w.requests[1].prompt[:64]
    b = wl.burst(requests=6, prefix_tokens=32, suffix_tokens=8, max_tokens=2, vocab=512, seed=1)
    assert b.open_loop and len(b.requests) == 7
    assert len({r.at for r in b.requests[1:]}) == 1 and b.requests[1].at > b.requests[0].at
    shared = [r for r in b.requests[1:] if r.prompt[:32] == b.requests[0].prompt[:32]]
    assert len(shared) == 3  # half of the burst reuses the warm prefix


def _run(config: str, rnd: int, p50: float, engines: int = 1, workload: str = "w") -> report.Run:
    r = report.Run(config=config, engines=engines, workload=workload, round=rnd)
    r.results = [client.Result(prompt_tokens=10, output_tokens=1, cached_tokens=0, ttft_s=p50, e2e_s=p50, itl_s=[], error="")]
    return r


def test_ratios_pair_rounds_and_bound_the_median() -> None:
    runs = []
    for rnd, (k, alt) in enumerate([(1.0, 2.0), (1.2, 2.0), (0.8, 2.0), (3.0, 2.0), (1.0, 2.5)], start=1):
        runs += [_run("kvtier-manager", rnd, k), _run("cpu", rnd, alt)]
    runs.append(_run("kvtier-manager", 6, 9.9))  # no cpu run in round 6: not paired, left out
    (x,) = [x for x in report.ratios(runs) if x["against"] == "cpu"]
    assert x["rounds"] == 5 and x["per_round"] == [0.5, 0.6, 0.4, 1.5, 0.4]
    assert x["median"] == 0.5
    assert x["lo"] <= x["median"] <= x["hi"] and 0.4 <= x["lo"] and x["hi"] <= 1.5
    assert report.bootstrap([0.7], seed=1) == (0.7, 0.7)


def test_quick_serving_benchmark_serves_tokens_from_kvtier(kvtier_bin: str) -> None:
    py = cpu_python()
    d = pathlib.Path(tempfile.mkdtemp(prefix="kvt-serving"))
    out = d / "results.json"
    # The wheel's daemon draws no charts: a kvtier built with -tags charts does.
    charts = d / "kvtier-charts"
    subprocess.run(["go", "build", "-tags", "charts", "-o", str(charts), "./cmd/kvtier"], cwd=ROOT, check=True)
    cmd = [py, str(BENCH / "serving.py"), "--quick", "--configs", "kvtier-manager", "--engines", "2",
           "--workloads", "mooncake,document,agent,burst",
           "--kvtier-bin", kvtier_bin, "--plot-bin", str(charts), "--vllm-python", py, "--json", str(out),
           "--plots", str(d / "plots"), "--work", str(d / "work"), "--startup-timeout", "400"]
    env = {**os.environ, "KVTIER_TRACE": str(TRACE)}
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    assert p.returncode == 0, p.stdout + p.stderr[-6000:]
    res = json.loads(out.read_text())
    runs = res["runs"]
    assert {r["workload"] for r in runs} == {"mooncake", "document", "agent", "burst"}
    for r in runs:
        assert not r["error"], r["error"]
        assert r["summary"]["failed"] == 0, r["request_errors"]
        assert len(r["ttft_s"]) == r["summary"]["requests"] > 0
        assert all(t > 0 for t in r["ttft_s"])
    # Two engines, one daemon: prompts one engine computed are served to
    # the other from kvtier.
    assert sum(r["hit_tokens"].get("kvtier", 0) for r in runs) > 0, [r["hit_tokens"] for r in runs]
    for name in ("ttft-mooncake.png", "hits-mooncake.png", "ttft-document.png", "hits-document.png"):
        assert (d / "plots" / name).stat().st_size > 0
    print(p.stdout)


def test_offload_counters_of_a_run() -> None:
    import serving

    moved = {"vllm:kv_offload_tiering_promotion_allocation_failures_total": 3.0,
             "vllm:kv_offload_lookup_async_delay_seconds_sum": 0.25, "vllm:kv_offload_lookup_async_delay_seconds_count": 2.0,
             "vllm:prompt_tokens_total": 99.0}
    assert serving.offload_counters(moved) == {"promotion_allocation_failures": 3.0, "lookup_deferred_s": 0.25,
                                               "lookup_deferrals": 2.0}


def test_quick_router_prefetches_for_every_request(kvtier_bin: str) -> None:
    """kvtier-router against a real vllm serve: the router computes each
    request's keys and the daemon takes every prefetch."""
    py = cpu_python()
    d = pathlib.Path(tempfile.mkdtemp(prefix="kvt-router"))
    out = d / "results.json"
    cmd = [py, str(BENCH / "serving.py"), "--quick", "--configs", "kvtier-router", "--engines", "1",
           "--workloads", "documents", "--kvtier-bin", kvtier_bin, "--vllm-python", py, "--json", str(out),
           "--work", str(d / "work"), "--startup-timeout", "400"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout + p.stderr[-6000:]
    (run,) = json.loads(out.read_text())["runs"]
    assert not run["error"] and run["summary"]["failed"] == 0, run
    off = run["offload_counters"]
    assert off["router_prefetch_calls"] == run["summary"]["requests"] and off["router_prefetch_failed"] == 0, off
