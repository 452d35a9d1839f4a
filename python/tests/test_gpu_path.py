"""python/bench/gpu_path.py, the GPU data path benchmark, end to end on
this machine's CPU (no GPU here: host memory stands in for the device and
registration is skipped, which its output says): against a real daemon
with a memfd arena and an fs tier, every buffer measured, the bytes that
come back from the "device" checked, the arena measured again while the
daemon cascades, and an epoch change timed."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

BENCH = pathlib.Path(__file__).resolve().parents[1] / "bench"


def test_gpu_path_runs_on_cpu(kvtier_bin: str, tmp_path: pathlib.Path) -> None:
    out = tmp_path / "gpu.json"
    p = subprocess.run([sys.executable, str(BENCH / "gpu_path.py"), "--kvtier-bin", kvtier_bin, "--device", "cpu",
                        "--arena", "64MiB", "--epoch-arenas", "128MiB", "--shapes", "tiny", "--block-tokens", "16,64",
                        "--batches", "1,8", "--rounds", "2", "--json", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr[-4000:]
    assert "registration skipped" in p.stdout
    doc = json.loads(out.read_text())
    assert not doc["cuda"]
    assert len(doc["rows"]) == 4  # 2 block sizes x 2 batch sizes
    for r in doc["rows"]:
        for name in ("arena", "pinned", "pageable", "arena_cascading"):
            assert r[name]["h2d"] > 0 and r[name]["d2h"] > 0, r
        assert r["cascaded_blocks"] > 0, r  # the daemon was cascading while the arena was read
    assert [e for e in doc["epochs"] if e["arena_bytes"] == 128 << 20 and "change_s" in e], doc["epochs"]
