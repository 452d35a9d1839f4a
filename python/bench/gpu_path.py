"""The GPU data path of kvtier's arena, measured: how fast vLLM-shaped KV
blocks move between the GPU and the daemon's memfd arena (mapped and
registered with CUDA as vLLM's CPUOffloadingWorker registers it), against
a torch pinned buffer of the same layout (the limit on the machine) and
pageable memory; the arena again while the daemon cascades the arena's
blocks to an fs tier at full speed; and what an epoch change costs
(unregister, unmap, map again, register).

    python python/bench/gpu_path.py --kvtier-bin bin/kvtier [--arena 8GiB] [--json out.json] [--png out.png]

Needs torch (with CUDA for the GPU figures), grpcio, protobuf and the
kvtier binary; no vLLM. Without CUDA (`--device cpu`, or no GPU) the
"device" is host memory and registration is skipped, which the output
says: that run checks the path end to end (the suite runs it so), its
GB/s are memory copies, not DMA.

A block is what vLLM's CPU offloading keeps per chunk: for every layer, K
and V of `block_tokens` tokens (kv_heads x head_dim, bf16). One arena slot
holds one block, layer after layer; a transfer of a batch of blocks copies
each layer's K/V page of each block (as vLLM's swap of a block list
does), into a GPU cache laid out [layer][block].
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import torch

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import kvtier  # noqa: E402

# (layers, kv_heads, head_dim): the attention shapes of two real models.
SHAPES = {
    "llama3-8b": (32, 8, 128),
    "gqa-70b": (80, 8, 128),
    "tiny": (4, 2, 64),  # the suite's CPU run
}
BF16 = 2


@dataclasses.dataclass
class Shape:
    name: str
    layers: int
    kv_heads: int
    head_dim: int
    block_tokens: int

    @property
    def page(self) -> int:
        """Bytes of one layer's K and V of one block."""
        return 2 * self.kv_heads * self.head_dim * self.block_tokens * BF16

    @property
    def block(self) -> int:
        return self.layers * self.page


def size_str(n: int) -> str:
    return f"{n / (1 << 30):.0f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.0f} MiB"


def parse_size(s: str) -> int:
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    for u, m in units.items():
        if s.endswith(u):
            return int(float(s[: -len(u)]) * m)
    return int(s)


class Daemon:
    """`kvtier serve` with a memfd arena of `arena` bytes in slots of
    `slot` bytes and an fs tier behind it, on a socket of its own."""

    def __init__(self, binary: str, dir: pathlib.Path, arena: int, slot: int) -> None:
        self.dir = dir
        self.sock = str(dir / "k.sock")
        cfg = dir / "kvtier.yaml"
        cfg.write_text(f"""namespace: {{model: gpu-path, bytes_per_block: {slot}}}
primary: {{bytes: {arena}, arena: {{kind: memfd}}}}
secondary_tiers:
  - {{name: disk, type: fs, root_dir: {dir / "data"}, fsync: none}}
server: {{unix_socket: {self.sock}, tcp_addr: "", metrics_addr: ""}}
events: {{enabled: false}}
""")
        self.log = open(dir / "kvtier.log", "wb")
        self.proc = subprocess.Popen([binary, "serve", "--config", str(cfg)], stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while not os.path.exists(self.sock):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"kvtier serve did not start: {(dir / 'kvtier.log').read_text()[-2000:]}")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


class Registered:
    """A host buffer registered with CUDA (cudaHostRegister), as vLLM
    registers the memory its CPU offloading copies through."""

    def __init__(self, t: torch.Tensor, on: bool) -> None:
        self.t = t
        self.on = on
        self.seconds = 0.0
        if on:
            t0 = time.perf_counter()
            err = torch.cuda.cudart().cudaHostRegister(t.data_ptr(), t.numel() * t.element_size(), 0)
            self.seconds = time.perf_counter() - t0
            if int(err) != 0:
                raise RuntimeError(f"cudaHostRegister of {t.numel() * t.element_size() / (1 << 30):.1f} GiB failed: {err}")

    def close(self) -> float:
        t0 = time.perf_counter()
        if self.on:
            torch.cuda.cudart().cudaHostUnregister(self.t.data_ptr())
        return time.perf_counter() - t0


def layered(buf: torch.Tensor, sh: Shape, blocks: int) -> torch.Tensor:
    """A host buffer of `blocks` slots seen as [block][layer][page bytes]."""
    return buf[: blocks * sh.block].view(blocks, sh.layers, sh.page)


def transfer(host: torch.Tensor, dev: torch.Tensor, idx: list[int], to_device: bool, sync: Any) -> float:
    """Copies the blocks idx (host [block][layer][page] <-> device
    [layer][block][page]), layer by layer and block by block; returns the
    seconds it took."""
    t0 = time.perf_counter()
    for layer in range(host.shape[1]):
        for j, b in enumerate(idx):
            if to_device:
                dev[layer, j].copy_(host[b, layer], non_blocking=True)
            else:
                host[b, layer].copy_(dev[layer, j], non_blocking=True)
    sync()
    return time.perf_counter() - t0


def measure(host: torch.Tensor, dev: torch.Tensor, sh: Shape, batch: int, rounds: int, sync: Any) -> dict[str, float]:
    """Median GB/s over rounds of a batch each way, over distinct slots."""
    nblocks = host.shape[0]
    out: dict[str, list[float]] = {"h2d": [], "d2h": []}
    for r in range(rounds):
        idx = [(r * batch + i) % nblocks for i in range(batch)]
        nbytes = batch * sh.block
        out["h2d"].append(nbytes / transfer(host, dev, idx, True, sync) / 1e9)
        out["d2h"].append(nbytes / transfer(host, dev, idx, False, sync) / 1e9)
    return {k: statistics.median(v) for k, v in out.items()}


def check_bytes(host: torch.Tensor, dev: torch.Tensor, sh: Shape, sync: Any) -> None:
    """A pattern written to slot 1 comes back from the device byte for
    byte: the measured path moves the right bytes."""
    pattern = torch.arange(sh.block, dtype=torch.int32).remainder(251).to(torch.uint8).view(sh.layers, sh.page)
    host[1].copy_(pattern)
    transfer(host, dev, [1], True, sync)
    host[1].zero_()
    transfer(host, dev, [1], False, sync)
    if not torch.equal(host[1], pattern):
        raise AssertionError("the bytes that came back from the device differ")


def cascade_load(daemon: Daemon, slot: int, stop: threading.Event, count: list[int]) -> None:
    """Stores new blocks into the daemon as fast as it takes them: every
    one is cascaded (read out of the arena) to the fs tier."""
    with kvtier.Client("unix://" + daemon.sock) as c:
        data = os.urandom(slot)
        i = 0
        while not stop.is_set():
            keys = [kvtier.make_key(b"gpu-path-%d" % (i + j)) for j in range(8)]
            c.put_blocks([(k, data) for k in keys])
            c.schedule_end()
            i += 8
            count[0] += 8


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kvtier-bin", default=os.environ.get("KVTIER_BIN", ""))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--arena", default="8GiB", help="the daemon's arena (memfd)")
    ap.add_argument("--epoch-arenas", default="8GiB,64GiB", help="arena sizes an epoch change is timed for (as memory allows)")
    ap.add_argument("--shapes", default="llama3-8b,gqa-70b")
    ap.add_argument("--block-tokens", default="16,64")
    ap.add_argument("--batches", default="1,8,64,256")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json")
    ap.add_argument("--png")
    a = ap.parse_args(argv)
    if not a.kvtier_bin:
        ap.error("--kvtier-bin (or KVTIER_BIN) names no kvtier binary")
    cuda = a.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        ap.error("--device cuda: torch sees no GPU")
    dev_name = torch.cuda.get_device_name() if cuda else "cpu (no GPU: host memory stands in; registration skipped)"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    shapes = [Shape(n, *SHAPES[n], bt) for n in a.shapes.split(",") for bt in (int(x) for x in a.block_tokens.split(","))]
    batches = [int(x) for x in a.batches.split(",")]
    arena = parse_size(a.arena)
    slot = max(sh.block for sh in shapes)
    nslots = arena // slot
    if nslots < 2 * max(batches):
        ap.error(f"--arena {a.arena} holds {nslots} slots of {slot} bytes: want at least {2 * max(batches)}")
    if cuda:
        dev_name += f" (torch {torch.__version__}, CUDA {torch.version.cuda}, driver {driver_version()})"
    print(f"device {dev_name}", flush=True)
    work = pathlib.Path(tempfile.mkdtemp(prefix="kvtier-gpu-"))
    daemon = Daemon(a.kvtier_bin, work, nslots * slot, slot)
    rows: list[dict[str, Any]] = []
    epochs: list[dict[str, Any]] = []
    try:
        with kvtier.Client("unix://" + daemon.sock) as c:
            m = c.map_arena()
        arena_t = torch.frombuffer(m._mm, dtype=torch.uint8)
        reg = Registered(arena_t, cuda)
        pinned = torch.empty(nslots * slot, dtype=torch.uint8, pin_memory=cuda)
        pageable = torch.empty(nslots * slot, dtype=torch.uint8)
        for sh in shapes:
            nb = min(nslots * slot // sh.block, 4 * max(batches))
            for batch in batches:
                dev = torch.empty((sh.layers, batch, sh.page), dtype=torch.uint8, device=a.device)
                row: dict[str, Any] = {"shape": sh.name, "block_tokens": sh.block_tokens, "block_bytes": sh.block, "batch": batch}
                for name, buf in (("arena", arena_t), ("pinned", pinned), ("pageable", pageable)):
                    host = layered(buf, sh, nb)
                    if batch == batches[0]:
                        check_bytes(host, dev, sh, sync)
                    row[name] = measure(host, dev, sh, batch, a.rounds, sync)
                    del host
                stop, count = threading.Event(), [0]
                t = threading.Thread(target=cascade_load, args=(daemon, slot, stop, count), daemon=True)
                t.start()
                deadline = time.monotonic() + 30
                while count[0] == 0 and t.is_alive() and time.monotonic() < deadline:
                    time.sleep(0.001)  # measured once the daemon is cascading
                try:
                    row["arena_cascading"] = measure(layered(arena_t, sh, nb), dev, sh, batch, a.rounds, sync)
                finally:
                    stop.set()
                    t.join(60)
                row["cascaded_blocks"] = count[0]
                for d in ("h2d", "d2h"):
                    row[f"arena/pinned {d}"] = row["arena"][d] / row["pinned"][d]
                    row[f"cascading/pinned {d}"] = row["arena_cascading"][d] / row["pinned"][d]
                rows.append(row)
                print(f"{sh.name} {sh.block_tokens}-token blocks ({sh.block / (1 << 20):.1f} MiB) x{batch}: "
                      + "; ".join(f"{n} {row[n]['h2d']:.2f}/{row[n]['d2h']:.2f} GB/s" for n in ("arena", "pinned", "pageable", "arena_cascading"))
                      + f" (h2d/d2h); arena/pinned {row['arena/pinned h2d']:.3f}/{row['arena/pinned d2h']:.3f}", flush=True)
                del dev
        unreg = reg.close()
        epochs.append({"arena_bytes": nslots * slot, "register_s": reg.seconds, "unregister_s": unreg, "skipped": not cuda})
        del arena_t
        m.close()
    finally:
        daemon.stop()
    # Epoch changes of larger arenas: a fresh daemon each, mapped and
    # registered once (the first), then unregistered, unmapped, mapped and
    # registered again (the change).
    for size in (parse_size(x) for x in a.epoch_arenas.split(",") if x):
        avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        if size > 0.8 * avail:
            epochs.append({"arena_bytes": size, "skipped": f"{size_str(avail)} of memory available"})
            print(f"epoch change of a {size_str(size)} arena: skipped ({size_str(avail)} available)")
            continue
        d = Daemon(a.kvtier_bin, pathlib.Path(tempfile.mkdtemp(prefix="kvtier-gpu-")), size - size % slot, slot)
        try:
            e: dict[str, Any] = {"arena_bytes": size, "skipped": not cuda}
            with kvtier.Client("unix://" + d.sock) as c:
                t0 = time.perf_counter()
                m = c.map_arena()
                e["map_s"] = time.perf_counter() - t0
                r = Registered(torch.frombuffer(m._mm, dtype=torch.uint8), cuda)
                e["first_register_s"] = r.seconds
                t0 = time.perf_counter()
                r.close()
                del r
                m.close()
                m = c.map_arena()
                r = Registered(torch.frombuffer(m._mm, dtype=torch.uint8), cuda)
                e["change_s"] = time.perf_counter() - t0
                r.close()
                del r
                m.close()
            epochs.append(e)
            print(f"epoch change of a {size_str(size)} arena: {e['change_s'] * 1000:.1f} ms "
                  f"(first map {e['map_s'] * 1000:.1f} ms, first registration {e['first_register_s'] * 1000:.1f} ms)"
                  + (" [registration skipped: no GPU]" if not cuda else ""), flush=True)
        except RuntimeError as err:
            epochs.append({"arena_bytes": size, "error": str(err)})
            print(f"epoch change of a {size_str(size)} arena: {err}")
        finally:
            d.stop()
    doc = {"device": dev_name, "cuda": cuda, "torch": torch.__version__, "rows": rows, "epochs": epochs,
           "argv": sys.argv[1:] if argv is None else argv}
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(doc, indent=1))
    if a.png:
        chart(rows, a.png, dev_name)
    return 0


def driver_version() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def chart(rows: list[dict[str, Any]], path: str, device: str) -> None:
    """GB/s per batch size, host to device, one line per buffer, a panel
    per block shape."""
    try:
        import matplotlib
    except ImportError:
        print(f"--png {path}: matplotlib is not installed; the figures are in the table and --json", file=sys.stderr)
        return

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = sorted({(r["shape"], r["block_tokens"]) for r in rows})
    fig, axes = plt.subplots(1, len(keys), figsize=(4.5 * len(keys), 3.6), squeeze=False)
    for ax, (shape, bt) in zip(axes[0], keys):
        rs = [r for r in rows if (r["shape"], r["block_tokens"]) == (shape, bt)]
        for name in ("arena", "pinned", "pageable", "arena_cascading"):
            ax.plot([r["batch"] for r in rs], [r[name]["h2d"] for r in rs], marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{shape}, {bt}-token blocks")
        ax.set_xlabel("blocks per transfer")
        ax.set_ylabel("host to device GB/s")
    axes[0][0].legend()
    fig.suptitle(device)
    fig.tight_layout()
    fig.savefig(path)


if __name__ == "__main__":
    sys.exit(main())
