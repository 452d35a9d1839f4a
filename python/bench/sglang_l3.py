"""kvtier.sglang's data path against a plain loopback socket stream of the
same bytes, in the same run, round after round.

Per round, interleaved:

* ``set``: ``batch_set_v1`` of 64 new pages of 2 MiB from an SGLang host
  pool (page_first, bf16) into a kvtier daemon's primary;
* ``get``: ``batch_get_v1`` of 64 pages the primary holds into other pages
  of the pool (its lookup included: no pins held from a batch_exists);
* ``tcp-write`` / ``tcp-read``: the same 128 MiB as 64 distinct 2 MiB
  buffers sent over a loopback TCP connection to (from) another process
  that receives (sends) them into (from) 64 distinct buffers;
* ``grpc-put`` / ``grpc-get``: the alternative the backend does not take,
  the same pages by value through the daemon's PutBlocks / GetBlocks;
* ``exists-hit`` / ``exists-miss``: ``batch_exists`` of 1 000 keys the
  primary holds (a separate pool of 128 KiB pages; no pins held, so that
  the calls repeat) and of 1 000 keys no tier holds; each *warm* (the
  median of 20 calls back to back) and *cold* (one call after 50 ms idle:
  the daemon's and gRPC's threads wake up first). Also the miss of one
  SGLang storage batch (128 keys), warm.

    .venv-sglang/bin/python python/bench/sglang_l3.py --rounds 9

It starts its own `kvtier serve` (KVTIER_BIN, or `go build`) on a
temporary Unix socket, with engines.primary_bytes of 1 GiB and an fs tier
in a temporary directory, and prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

PAGES = 64
PAGE_TOKENS = 64
# 2 (K, V) x 64 tokens x 16 layers x 8 heads x 64 dims x 2 bytes = 2 MiB
LAYERS, HEADS, DIM = 16, 8, 64

_PEER = r"""
import socket, sys
n, size = int(sys.argv[1]), int(sys.argv[2])
bufs = [bytearray(size) for _ in range(n)]
ls = socket.socket(); ls.bind(("127.0.0.1", 0)); ls.listen(1)
print(ls.getsockname()[1], flush=True)
c, _ = ls.accept()
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
while True:
    op = c.recv(1)
    if not op:
        break
    if op == b"w":
        for b in bufs:
            v = memoryview(b)
            got = 0
            while got < size:
                got += c.recv_into(v[got:])
        c.sendall(b"k")
    else:
        for b in bufs:
            c.sendall(b)
"""


class Stream:
    """A plain loopback TCP stream to another process holding n buffers."""

    def __init__(self, n: int, size: int) -> None:
        self.n, self.size = n, size
        self.proc = subprocess.Popen([sys.executable, "-c", _PEER, str(n), str(size)], stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        port = int(self.proc.stdout.readline())
        self.s = socket.create_connection(("127.0.0.1", port))
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.bufs = [bytearray(os.urandom(16)) * (size // 16) for _ in range(n)]

    def write(self) -> None:
        self.s.sendall(b"w")
        for b in self.bufs:
            self.s.sendall(b)
        assert self.s.recv(1) == b"k"

    def read(self) -> None:
        self.s.sendall(b"r")
        for b in self.bufs:
            v = memoryview(b)
            got = 0
            while got < self.size:
                got += self.s.recv_into(v[got:])

    def close(self) -> None:
        self.s.close()
        self.proc.wait(10)


def start_daemon(binary: str, primary: str) -> Any:
    from conftest import Daemon

    d = pathlib.Path(tempfile.mkdtemp(prefix="kvb"))
    return Daemon(binary, d, f"""
namespace: {{model: unused, bytes_per_block: 4KiB}}
primary: {{bytes: 0}}
engines: {{primary_bytes: {primary}}}
secondary_tiers:
  - {{name: disk, type: fs, root_dir: {d}/data, locality: local}}
server: {{unix_socket: {d}/k.sock, tcp_addr: "", metrics_addr: "", shutdown_timeout: 20s}}
""").start()


def host_pool(layers: int, heads: int, dim: int, pages: int) -> Any:
    import torch
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost

    kv = MHATokenToKVPool(PAGE_TOKENS * 2, PAGE_TOKENS, torch.bfloat16, heads, dim, layers, "cpu", False,
                          start_layer=0, end_layer=layers)
    host = MHATokenToKVPoolHost(kv.get_device_pool_infos()[0].buffer_info, 1.0, 0, PAGE_TOKENS, "page_first",
                                pin_memory=False, device="cpu", device_capacity_tokens=pages * PAGE_TOKENS,
                                start_layer=0, end_layer=layers, write_back_staging=kv.hicache_write_back_staging,
                                host_token_capacity=pages * PAGE_TOKENS)
    host.kv_buffer.copy_(torch.randn(host.kv_buffer.shape).to(torch.bfloat16))
    host.device_pool = kv
    return host


def backend(daemon: Any, host: Any, model: str, **extra: Any) -> Any:
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
    from sglang.srt.mem_cache.storage import StorageBackendFactory

    cfg = HiCacheStorageConfig(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1, is_mla_model=False,
        enable_storage_metrics=False, is_page_first_layout=True, model_name=model,
        extra_config={"backend_name": "kvtier", "module_path": "kvtier.sglang", "class_name": "KvtierHiCacheStorage",
                      "target": "unix://" + daemon.sock, **extra})
    b = StorageBackendFactory.create_backend("dynamic", cfg, host)
    b.register_mem_pool_host(host)
    return b


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--kvtier-bin", default=os.environ.get("KVTIER_BIN", ""))
    args = ap.parse_args()
    import hashlib

    import torch

    from kvtier.v1 import kvtier_pb2 as pb

    binary = args.kvtier_bin
    if not binary:
        binary = str(pathlib.Path(tempfile.mkdtemp()) / "kvtier")
        subprocess.run(["go", "build", "-o", binary, "./cmd/kvtier"], check=True,
                       cwd=pathlib.Path(__file__).resolve().parents[2])
    daemon = start_daemon(binary, "1GiB")
    host = host_pool(LAYERS, HEADS, DIM, 3 * PAGES)
    b = backend(daemon, host, "bench-2mib")
    page_bytes = b._page_bytes
    assert page_bytes == 2 << 20, page_bytes
    small = host_pool(1, 8, 64, 8)  # 128 KiB pages for the 1 000-key lookups
    bs = backend(daemon, small, "bench-128kib", hold_s=0)
    # Measure the steady state: the backends fault their arena mappings in
    # on a thread of their own after attaching.
    for x in (b, bs):
        x._link.populated.wait(120)
    src, dst = torch.arange(0, PAGES * PAGE_TOKENS), torch.arange(PAGES * PAGE_TOKENS, 2 * PAGES * PAGE_TOKENS)
    stream = Stream(PAGES, page_bytes)
    client = b._link.client

    def keys(tag: str, n: int) -> list[str]:
        return [hashlib.sha256(f"{tag}-{i}".encode()).hexdigest() for i in range(n)]

    # 1 000 keys the small pool's primary holds (8 pages stored 125 times over).
    hit_keys = keys("hit", 1000)
    for i in range(0, 1000, 8):
        assert all(bs.batch_set_v1(hit_keys[i:i + 8], torch.arange(0, 8 * PAGE_TOKENS)))
    resident = keys("resident", PAGES)
    assert all(b.batch_set_v1(resident, src))
    ns = b._link.namespace
    by_value = [bytes(host.get_data_page(i * PAGE_TOKENS, flat=True).view(torch.uint8).numpy()) for i in range(PAGES)]

    def grpc_put(tag: str) -> None:
        ks = [hashlib.sha256(f"{tag}-{i}".encode()).digest() for i in range(PAGES)]
        for i in range(0, PAGES, 16):  # 32 MiB per call: under the 64 MiB message bound
            client.stub.PutBlocks(pb.PutBlocksRequest(namespace=ns, blocks=[
                pb.Block(key=k, data=d) for k, d in zip(ks[i:i + 16], by_value[i:i + 16])]), timeout=60)

    def grpc_get() -> None:
        ks = [bytes.fromhex(k) for k in resident]
        for i in range(0, PAGES, 16):
            rep = client.stub.GetBlocks(pb.GetBlocksRequest(namespace=ns, keys=ks[i:i + 16]), timeout=60)
            assert sum(1 for blk in rep.blocks if blk.data) == 16
            for j, blk in enumerate(rep.blocks):  # into the pool, as the backend would
                page = host.get_data_page(int(dst[(i + j) * PAGE_TOKENS]), flat=False)
                page.copy_(torch.frombuffer(bytearray(blk.data), dtype=page.dtype).view(page.shape))

    results: dict[str, list[float]] = {k: [] for k in (
        "set", "get", "tcp-write", "tcp-read", "grpc-put", "grpc-get", "exists-hit", "exists-hit-cold",
        "exists-miss", "exists-miss-cold", "exists-miss-128")}
    loads = []
    for r in range(args.rounds + 1):
        t: dict[str, float] = {}

        def clock(name: str, fn: Any) -> Any:
            t0 = time.perf_counter()
            out = fn()
            t[name] = time.perf_counter() - t0
            return out

        ok = clock("set", lambda: b.batch_set_v1(keys(f"new{r}", PAGES), src))
        assert all(ok), ok
        clock("tcp-write", stream.write)
        ok = clock("get", lambda: b.batch_get_v1(resident, dst))
        assert all(ok), ok
        clock("tcp-read", stream.read)
        clock("grpc-put", lambda: grpc_put(f"grpc{r}"))
        clock("grpc-get", grpc_get)

        def timed(ks: list[str], want: int) -> float:
            t0 = time.perf_counter()
            n = bs.batch_exists(ks)
            dt = time.perf_counter() - t0
            assert n == want, n
            return dt

        time.sleep(0.05)
        t["exists-hit-cold"] = timed(hit_keys, 1000)
        t["exists-hit"] = statistics.median(timed(hit_keys, 1000) for _ in range(20))
        time.sleep(0.05)
        t["exists-miss-cold"] = timed(keys(f"miss{r}", 1000), 0)
        t["exists-miss"] = statistics.median(timed(keys(f"miss{r}-{i}", 1000), 0) for i in range(20))
        t["exists-miss-128"] = statistics.median(timed(keys(f"miss128-{r}-{i}", 128), 0) for i in range(20))
        if r == 0:
            continue  # warm-up
        for k, v in t.items():
            results[k].append(v)
        loads.append(os.getloadavg()[0])
        time.sleep(0.2)  # let the round's cascades to the fs tier finish outside the next round's copies
    stream.close()
    b.close()
    bs.close()
    daemon.stop()
    mib = PAGES * page_bytes / (1 << 20)

    def mbps(xs: list[float]) -> list[float]:
        return [round(mib / x) for x in xs]

    out = {
        "pages": PAGES, "page_bytes": page_bytes, "rounds": args.rounds, "load_1m": [round(x, 2) for x in loads],
        "cpus": os.cpu_count(),
        "MiB_per_s": {k: mbps(results[k]) for k in ("set", "get", "tcp-write", "tcp-read", "grpc-put", "grpc-get")},
        "ratio_set_to_tcp_write": [round(w / s, 2) for s, w in zip(results["set"], results["tcp-write"])],
        "ratio_get_to_tcp_read": [round(w / s, 2) for s, w in zip(results["get"], results["tcp-read"])],
        "ratio_grpc_put_to_tcp_write": [round(w / s, 2) for s, w in zip(results["grpc-put"], results["tcp-write"])],
        "ratio_grpc_get_to_tcp_read": [round(w / s, 2) for s, w in zip(results["grpc-get"], results["tcp-read"])],
        "exists_1000_hit_warm_ms": [round(x * 1e3, 3) for x in results["exists-hit"]],
        "exists_1000_hit_cold_ms": [round(x * 1e3, 3) for x in results["exists-hit-cold"]],
        "exists_1000_miss_warm_ms": [round(x * 1e3, 3) for x in results["exists-miss"]],
        "exists_1000_miss_cold_ms": [round(x * 1e3, 3) for x in results["exists-miss-cold"]],
        "exists_128_miss_warm_ms": [round(x * 1e3, 3) for x in results["exists-miss-128"]],
    }
    for k in list(out):
        if k.startswith("ratio") or k.startswith("exists"):
            out[k + "_median"] = statistics.median(out[k])
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
