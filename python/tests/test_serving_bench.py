"""The serving benchmark (python/bench/serving.py, scripts/serving-bench.sh)
in its --quick form: a real `vllm serve` on the CPU backend, two engines
behind one kvtier daemon in manager mode, both workloads; the harness
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
sys.path.insert(0, str(BENCH))

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


def test_quick_serving_benchmark_serves_tokens_from_kvtier(kvtier_bin: str) -> None:
    py = cpu_python()
    d = pathlib.Path(tempfile.mkdtemp(prefix="kvt-serving"))
    out = d / "results.json"
    cmd = [py, str(BENCH / "serving.py"), "--quick", "--configs", "kvtier-manager", "--engines", "2",
           "--kvtier-bin", kvtier_bin, "--vllm-python", py, "--json", str(out), "--plots", str(d / "plots"),
           "--work", str(d / "work"), "--startup-timeout", "400"]
    env = {**os.environ, "KVTIER_TRACE": str(TRACE)}
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    assert p.returncode == 0, p.stdout + p.stderr[-6000:]
    res = json.loads(out.read_text())
    runs = res["runs"]
    assert {r["workload"] for r in runs} == {"mooncake", "document"}
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
