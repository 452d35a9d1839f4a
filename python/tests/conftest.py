"""Fixtures: a real `kvtier serve` built from this tree, and vLLM specs.

KVTIER_BIN names a built kvtier binary (scripts/test.sh builds one); else
the session builds it with `go build`.

KVTIER_TEST_AS_TENANT=1 runs the engine suites with every engine a tenant:
the daemons the helpers configure get an admin token, which the helpers'
own clients send, and map this process's uid to the tenant "suite"
(server.unix_peers), so engines, which send no token, attach, store and
load as that tenant — in an engine namespace and arena of its own in
manager mode and SGLang, in its key space in tier mode.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from typing import Any, Iterator

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

AS_TENANT = os.environ.get("KVTIER_TEST_AS_TENANT") == "1"
SUITE_ADMIN = "suite-admin-token-0123456789"


def stored_hash(k: bytes) -> bytes:
    """The block hash the daemon's tiers hold an engine's key k under: with
    KVTIER_TEST_AS_TENANT, behind the tenant's key-space tag (package
    keyspace: 0xfe and the space's 8-byte ID)."""
    h = k[:-4]  # the offload key without its 4-byte group
    if not AS_TENANT:
        return h
    sid = int.from_bytes(hashlib.sha256(b"kvtier key space\x00tenant/suite").digest()[:8], "big") or 1
    return b"\xfe" + sid.to_bytes(8, "big") + h

os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def kvtier_bin() -> str:
    if b := os.environ.get("KVTIER_BIN"):
        return b
    out = pathlib.Path(tempfile.mkdtemp(prefix="kvtier-bin")) / "kvtier"
    subprocess.run(["go", "build", "-o", str(out), "./cmd/kvtier"], cwd=ROOT, check=True)
    return str(out)


class Daemon:
    """A running `kvtier serve`."""

    def __init__(self, binary: str, dir: pathlib.Path, config: str) -> None:
        self.dir = dir
        self.sock = str(dir / "k.sock")
        self.config_path = dir / "kvtier.yaml"
        self.config_path.write_text(config)
        self.binary = binary
        # The admin token its helpers send (a config with tokens refuses
        # token-less calls on the socket unless server.unix_peers maps the uid).
        self.token: str | None = SUITE_ADMIN if AS_TENANT else None
        self.log: list[str] = []
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> "Daemon":
        self.log = []
        self.proc = subprocess.Popen(
            [self.binary, "serve", "--config", str(self.config_path)],
            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
        )
        ready = threading.Event()

        def read() -> None:
            assert self.proc is not None and self.proc.stderr is not None
            for line in self.proc.stderr:
                self.log.append(line)
                if "kvtier API listening" in line:
                    ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(30):
            self.kill()
            raise RuntimeError("kvtier serve did not start:\n" + "".join(self.log))
        return self

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def pause(self) -> None:
        """SIGSTOP, returning once every thread of the daemon has stopped:
        the signal is delivered asynchronously, and a thread still running
        on another core could answer one more call (on a busy machine it
        did)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)
        tasks = pathlib.Path(f"/proc/{self.proc.pid}/task")

        def stopped() -> bool:
            try:
                return all((t / "stat").read_text().rsplit(")", 1)[1].split()[0] in ("T", "t") for t in tasks.iterdir())
            except FileNotFoundError:
                return False  # a thread came or went while reading
        wait_until(stopped, what="every thread of the daemon stopped")

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def client(self, namespace: str = "") -> Any:
        import kvtier

        return kvtier.Client(self.sock, namespace=namespace, token=self.token)

    def tier_stats(self, namespace: str) -> dict[str, Any]:
        """Per-tier counters of a namespace, by tier name."""
        with self.client(namespace) as c:
            st = c.stats()
        return {t.name: t for t in st.tiers}


def server_config(dir: pathlib.Path) -> str:
    """The server section of the helpers' daemons (and, with
    KVTIER_TEST_AS_TENANT, the tenant its engines are)."""
    s = f'unix_socket: {dir}/k.sock, tcp_addr: "", metrics_addr: "", shutdown_timeout: 20s'
    if not AS_TENANT:
        return "server: {" + s + "}\n"
    return ("server: {" + s + f", auth_token: {SUITE_ADMIN}, unix_peers: [{{uid: {os.getuid()}, as: suite}}]}}\n"
            "tenants:\n  - {name: suite, token: suite-tenant-token-0123456789, namespaces: [default]}\n")


def daemon_config(dir: pathlib.Path, extra_tiers: str = "") -> str:
    return f"""
namespace: {{model: unused, bytes_per_block: 4KiB}}
primary: {{bytes: 0}}
secondary_tiers:
  - {{name: disk, type: fs, root_dir: {dir}/data, locality: local}}
  - {{name: dram, type: memory, medium: cpu, locality: remote}}
{extra_tiers}
{server_config(dir)}"""


def engine_daemon_config(dir: pathlib.Path, primary_bytes: str) -> str:
    """A manager-mode daemon: each engine layout gets a primary of
    primary_bytes, with a disk tier under dir behind it."""
    return f"""
namespace: {{model: unused, bytes_per_block: 4KiB}}
primary: {{bytes: 0}}
engines: {{primary_bytes: {primary_bytes}}}
secondary_tiers:
  - {{name: disk, type: fs, root_dir: {dir}/data, locality: local}}
{server_config(dir)}"""


@pytest.fixture
def daemon(kvtier_bin: str) -> Iterator[Daemon]:
    d = pathlib.Path(tempfile.mkdtemp(prefix="kvt"))  # short: socket paths are limited
    dm = Daemon(kvtier_bin, d, daemon_config(d)).start()
    yield dm
    dm.stop()


def offloading_config(extra: dict[str, Any], *, kv_bytes_per_block: int = 4096, engine_id: str | None = None,
                      events: bool = True) -> Any:
    """vLLM's normalized OffloadingConfig for a one-layer model on one
    worker, built as build_offloading_config would."""
    from vllm.v1.kv_offload.config import (
        OffloadingCacheConfig,
        OffloadingConfig,
        OffloadingGroupConfig,
        OffloadingModelConfig,
        OffloadingParallelConfig,
    )

    return OffloadingConfig(
        groups=(OffloadingGroupConfig(tokens_per_block=16, layer_names=("model.layers.0.self_attn",), group_id=0),),
        worker_kv_bytes_per_block=kv_bytes_per_block,
        enable_kv_cache_events=events,
        extra_config=extra,
        engine_id=engine_id or f"kvtier-test-{uuid.uuid4().hex[:12]}",
        model=OffloadingModelConfig(name="tiny-llama", dtype="float16"),
        cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(
            rank=0, world_size=1, tp_size=1, pp_size=1, pcp_size=1, dcp_size=1,
            data_parallel_index=0, data_parallel_size=1, data_parallel_rank_local=None,
            is_parallelism_agnostic=False,
        ),
    )


def wait_until(cond: Any, timeout: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)
