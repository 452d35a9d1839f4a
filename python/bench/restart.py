"""Restart time of a daemon with N blocks on its fs tier, and the daemon's
memory beyond its arena (issue 43: the Helm chart's startup probe and
memory limit are sized from these).

Usage: python restart.py --kvtier-bin BIN [--blocks 100000] [--rounds 3]
       [--primary-mib 1024] [--cold] [--json OUT]

Restart: a daemon with a 4 KiB block and an fs tier stores N blocks to the
fs tier (PutBlocks with kv_store_tiers storage), waits until the tier holds
them, stops (SIGTERM) and starts again; each round times the start until the
API listens and until the fs tier reports all N blocks, and a GetBlocks of a
sample of them. Memory: a daemon with a memfd primary of --primary-mib MiB
and 2 MiB blocks fills it by PutBlocks; VmRSS - RssShmem (the arena's pages)
is the daemon's own memory, measured idle and after the fill.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import kvtier  # noqa: E402


class Daemon:
    def __init__(self, binary: str, dir: pathlib.Path, config: str) -> None:
        self.dir, self.binary = dir, binary
        self.path = dir / "kvtier.yaml"
        self.path.write_text(config)
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> float:
        t0 = time.monotonic()
        self.proc = subprocess.Popen([self.binary, "serve", "--config", str(self.path)],
                                     stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        ready = threading.Event()

        def read() -> None:
            assert self.proc and self.proc.stderr
            for line in self.proc.stderr:
                if "kvtier API listening" in line:
                    ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(600):
            raise RuntimeError("the daemon did not start")
        return time.monotonic() - t0

    def stop(self) -> None:
        assert self.proc
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(120)

    def client(self) -> kvtier.Client:
        return kvtier.Client(str(self.dir / "k.sock"))

    def status(self) -> dict[str, int]:
        assert self.proc
        out = {}
        for line in open(f"/proc/{self.proc.pid}/status"):
            k, _, v = line.partition(":")
            if k in ("VmRSS", "RssAnon", "RssFile", "RssShmem", "VmHWM"):
                out[k] = int(v.split()[0]) * 1024
        return out


def fs_blocks(c: kvtier.Client) -> int:
    return next(t.blocks for t in c.stats().tiers if t.type == "fs")


def drop_caches() -> bool:
    """Empties the page cache (root only), so that a start reads the fs
    tier's directories from disk."""
    try:
        os.sync()
        pathlib.Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def restart(binary: str, n: int, rounds: int, cold: bool = False) -> dict:
    d = pathlib.Path(tempfile.mkdtemp(prefix="kvr"))
    dm = Daemon(binary, d, f"""
namespace: {{model: restart, bytes_per_block: 4KiB}}
primary: {{bytes: 64MiB}}
secondary_tiers:
  - {{name: disk, type: fs, root_dir: {d}/data, locality: local}}
server: {{unix_socket: {d}/k.sock, tcp_addr: "", metrics_addr: "", shutdown_timeout: 60s}}
""")
    dm.start()
    keys = [i.to_bytes(8, "big") + b"\0\0\0\0" for i in range(1, n + 1)]
    data = bytes(4096)
    t0 = time.monotonic()
    with dm.client() as c:
        # One batch at a time, each on disk before the next: a backlog of
        # cascades larger than the primary would be revoked by the stores.
        for i in range(0, n, 1000):
            c.put_blocks([(k, data) for k in keys[i:i + 1000]], params={"kv_store_tiers": [{"medium": "storage"}]})
            while fs_blocks(c) < min(n, i + 1000):
                c.schedule_end()
                time.sleep(0.01)
    fill = time.monotonic() - t0
    dm.stop()
    out = {"blocks": n, "fill_s": round(fill, 1), "cold": cold, "rounds": []}
    for _ in range(rounds):
        if cold and not drop_caches():
            raise SystemExit("--cold needs root (writes /proc/sys/vm/drop_caches)")
        listen = dm.start()
        t1 = time.monotonic()
        with dm.client() as c:
            while fs_blocks(c) < n:
                time.sleep(0.05)
            indexed = listen + time.monotonic() - t1
            sample = keys[:: max(1, n // 1000)]
            _, got, _ = c.get_blocks(sample, wait_ms=10000)
            hits = sum(g is not None for g in got)
        dm.stop()
        out["rounds"].append({"listening_s": round(listen, 2), "indexed_s": round(indexed, 2), "sample_hits": hits, "sample": len(sample)})
    return out


def memory(binary: str, primary_mib: int) -> dict:
    d = pathlib.Path(tempfile.mkdtemp(prefix="kvm"))
    dm = Daemon(binary, d, f"""
namespace: {{model: memory, bytes_per_block: 2MiB}}
primary: {{bytes: {primary_mib}MiB, arena: {{kind: memfd}}}}
secondary_tiers: []
server: {{unix_socket: {d}/k.sock, tcp_addr: "", metrics_addr: "127.0.0.1:0", shutdown_timeout: 10s}}
""")
    dm.start()
    idle = dm.status()
    block = os.urandom(2 << 20)
    with dm.client() as c:
        n = primary_mib // 2
        for i in range(0, n, 16):
            c.put_blocks([(j.to_bytes(8, "big") + b"\0\0\0\0", block) for j in range(i + 1, min(n, i + 16) + 1)])
        full = dm.status()
    dm.stop()
    own = lambda s: s["VmRSS"] - s["RssShmem"]  # noqa: E731
    return {"primary_mib": primary_mib, "idle_own_mib": round(own(idle) / 2**20, 1),
            "full_own_mib": round(own(full) / 2**20, 1), "full_rss_mib": round(full["VmRSS"] / 2**20, 1),
            "full_shmem_mib": round(full["RssShmem"] / 2**20, 1), "peak_rss_mib": round(full["VmHWM"] / 2**20, 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvtier-bin", required=True)
    ap.add_argument("--blocks", type=int, default=100000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--primary-mib", type=int, default=1024)
    ap.add_argument("--cold", action="store_true", help="drop the page cache before each start (root)")
    ap.add_argument("--json")
    a = ap.parse_args()
    res = {"load": os.getloadavg(), "memory": memory(a.kvtier_bin, a.primary_mib),
           "restart": restart(a.kvtier_bin, a.blocks, a.rounds, a.cold)}
    print(json.dumps(res, indent=1))
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
