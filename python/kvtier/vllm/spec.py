"""KvtierOffloadingSpec: kvtier as vLLM's whole offloading spec (manager
mode). kvtier's primary *is* the CPU cache vLLM's worker copies GPU blocks
into, shared by every engine attached to the daemon with the same layout.

    {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
     "kv_connector_extra_config": {"spec_name": "KvtierOffloadingSpec",
       "kvtier": {"target": "unix:///run/kvtier/kvtier.sock"}}}

The spec computes vLLM's chunk layout from the engine's config, attaches
to (or has the daemon create) the namespace whose slots fit it, and maps
the daemon's arena. get_manager() returns KvtierProxyManager, which talks
to the daemon once per step, off the scheduler thread; get_worker() returns
an ArenaWorker, which copies with vLLM's CPUOffloadingWorker on CUDA/XPU and
with HostCopyWorker on the CPU backend, through the arena of the epoch each
transfer names (a restarted daemon's arena is another; see manager.py).
"""

from __future__ import annotations

import logging
import mmap
import os
from typing import TYPE_CHECKING, Any

from kvtier.vllm import _compat as vc
from kvtier.vllm import _region

if TYPE_CHECKING:
    from kvtier.client import Client
    from kvtier.v1 import kvtier_pb2 as pb
    from kvtier.vllm.manager import KvtierProxyManager

PAGESIZE = mmap.PAGESIZE

log = logging.getLogger("kvtier.vllm")

_KEYS = ("target", "token", "token_file", "timeout_s", "lookup_timeout_s", "reconnect_interval_s", "lease_steps", "min_free_slots",
         "first_sight_ms")


def _round_up(n: int, to: int) -> int:
    return (n + to - 1) // to * to


class KvtierOffloadingSpec(vc.OffloadingSpec):
    """Keys of ``kv_connector_extra_config["kvtier"]``: ``target`` (the
    daemon's Unix socket), ``token``, ``timeout_s`` (the bound on one call
    to the daemon, 10), ``lookup_timeout_s`` (how long a lookup may wait for
    the daemon's answer before it answers MISS, 1), ``reconnect_interval_s``
    (how often to attach again while the daemon is away, 1),
    ``lease_steps`` (how many steps an unused lookup lease is kept, 8),
    ``min_free_slots`` (the smallest pool of leased store slots, 64),
    ``first_sight_ms`` (the scheduler thread's time per step for the
    synchronous first lookups of new requests, 5; 0: none)."""

    def __init__(self, config: vc.OffloadingConfig) -> None:
        super().__init__(config)
        kc = dict(self.extra_config.get("kvtier") or {})
        self._target = kc.pop("target", "unix:///run/kvtier/kvtier.sock")
        from kvtier.client import token_of

        self._token = token_of(kc.pop("token", None), kc.pop("token_file", None), "kvtier spec")
        self._timeout = _positive(kc, "timeout_s", 10.0)
        self._lookup_timeout = min(_positive(kc, "lookup_timeout_s", 1.0), self._timeout)
        self._reconnect_interval = _positive(kc, "reconnect_interval_s", 1.0)
        self._lease_steps = int(kc.pop("lease_steps", 8))
        self._min_free = int(kc.pop("min_free_slots", 64))
        first_sight_ms = float(kc.pop("first_sight_ms", 5.0))
        if not first_sight_ms >= 0:
            raise ValueError(f"kvtier spec: first_sight_ms {first_sight_ms!r}: want a number of milliseconds >= 0")
        self._first_sight_s = first_sight_ms / 1000
        if kc:
            raise ValueError(f"kvtier spec: unknown key(s) {sorted(kc)} in kv_connector_extra_config.kvtier "
                             f"(known: {', '.join(_KEYS)})")
        self._path = _region.unix_path(self._target)
        par = config.parallel
        self.replicated_layout = bool(config.replicated_layout)
        num_copies = 1 if self.replicated_layout else par.world_size
        unaligned = config.worker_kv_bytes_per_block * num_copies * self.blocks_per_chunk
        self.cpu_page_size_per_worker = unaligned // max(num_copies, 1)
        self.kv_bytes_per_chunk = _round_up(unaligned, PAGESIZE)
        self._manager: KvtierProxyManager | None = None
        self._worker: ArenaWorker | None = None
        self._client: Client | None = None
        self.namespace, self.num_chunks, self._fd_socket, self.epoch = self._attach()

    def _layout(self) -> dict[str, Any]:
        cfg = self.config
        par = cfg.parallel
        return {
            "num_blocks": 0,
            "row_stride": self.kv_bytes_per_chunk,
            "blocks_per_chunk": int(self.blocks_per_chunk),
            "tokens_per_block": int(self.tokens_per_block[0]) if self.tokens_per_block else 0,
            "tokens_per_hash": int(self.tokens_per_hash),
            "model": str(cfg.model.name), "dtype": str(cfg.model.dtype),
            "world_size": int(par.world_size), "tp": int(par.tp_size), "pp": int(par.pp_size),
            "pcp": int(par.pcp_size), "dcp": int(par.dcp_size),
            "replicated_layout": self.replicated_layout, "canonical_layout": bool(getattr(cfg, "canonical_layout", False)),
            "cpu_page_size": self.cpu_page_size_per_worker,
            "kv_cache_layout": str(getattr(cfg, "kv_cache_layout", "") or ""),
            "groups": [{"tokens_per_block": int(g.tokens_per_block), "layer_names": [str(n) for n in g.layer_names]} for g in cfg.groups],
        }

    def _attach(self) -> tuple[str, int, str, int]:
        _, rep = self.attach(self.client())
        return rep.namespace, int(rep.num_slots), rep.fd_socket, int(rep.epoch)

    def attach(self, c: Client | None = None) -> tuple[Client, pb.EngineAttachResponse]:
        """Attaches the engine's layout on connection c, or on a new one
        (the daemon creates the namespace if it has none); returns the
        connection and the EngineAttachResponse once its slots fit the
        engine's chunks (a new connection is closed on failure)."""
        import grpc

        from kvtier import _daemon

        try:
            if c is None:
                c, rep = _daemon.attach("unix://" + self._path, self._token, self._layout(), self._timeout)
            else:
                rep = c.engine_attach(self._layout(), timeout=self._timeout)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.UNAVAILABLE:
                raise _region.DaemonUnavailable(
                    f"kvtier spec: no kvtier daemon at {self._target} (is `kvtier serve` running there?): {e.details()}") from e
            raise RuntimeError(f"kvtier spec: the daemon at {self._target} refused the engine: {e.code().name}: {e.details()}") from e
        if rep.slot_size != self.kv_bytes_per_chunk:
            if c is not self._client:
                c.close()
            raise RuntimeError(f"kvtier spec: namespace {rep.namespace} has {rep.slot_size}-byte slots, the engine's chunks are {self.kv_bytes_per_chunk} bytes")
        return c, rep

    def client(self) -> Client:
        if self._client is None:
            import kvtier

            self._client = kvtier.Client("unix://" + self._path, token=self._token)
        return self._client

    def get_manager(self) -> KvtierProxyManager:
        if self._manager is None:
            from kvtier.vllm.manager import KvtierProxyManager

            self._manager = KvtierProxyManager(self)
        return self._manager

    def arena_region(self, rank: int, epoch: int | None = None) -> "ArenaRegion":
        """The daemon's arena as a vLLM region, for this worker rank; with
        epoch, only that epoch's arena (else DaemonUnavailable)."""
        import grpc

        from kvtier import _daemon

        try:
            # A ticket of its own: the attach's may be long spent or
            # expired (a worker maps after the model has loaded).
            ticket = self.client().arena_info(self.namespace, timeout=self._timeout).ticket
            fd, reply = _daemon.receive_arena(self._fd_socket, self.namespace, ticket, epoch)
        except grpc.RpcError as e:
            raise _region.DaemonUnavailable(f"kvtier spec: no arena from the daemon at {self._target}: {e}") from e
        except _region.DaemonUnavailable as e:
            raise _region.DaemonUnavailable(f"kvtier spec: the daemon at {self._target}: {e}") from e
        got = int(reply.get("epoch") or 0)
        try:
            return ArenaRegion(fd, int(reply.get("num_slots") or self.num_chunks), self.kv_bytes_per_chunk,
                               self.cpu_page_size_per_worker, rank, got)
        except BaseException:
            os.close(fd)
            raise

    def get_worker(self, kv_caches: vc.CanonicalKVCaches) -> ArenaWorker:
        if self._worker is None:
            rank = 0 if self.replicated_layout else self.config.parallel.rank
            self._worker = ArenaWorker(self, kv_caches, rank)
        return self._worker


def _positive(kc: dict[str, Any], key: str, default: float) -> float:
    v = float(kc.pop(key, default))
    if not v > 0:
        raise ValueError(f"kvtier spec: {key} must be a positive number of seconds, not {v}")
    return v


class ArenaWorker(vc.OffloadingWorker):
    """vLLM's worker (or HostCopyWorker) over the daemon's arena, mapped
    per epoch.

    Every transfer's slots name the epoch of the arena they belong to
    (manager.KvtierSlotSpec). Before the first transfer of a new epoch the worker
    waits for every transfer of the old mapping, unmaps it and maps the new
    epoch's arena; no transfer touches the old mapping after that. The
    scheduler switches links only between steps and vLLM submits a step's
    deferred stores before its loads, so every job of an epoch reaches the
    worker before any job of the next.

    When the daemon no longer serves the epoch a transfer names (it
    restarted again before this worker mapped it), a store is skipped —
    its slot was never bound, nothing reads it — and a load fails loudly:
    vLLM 0.33 cannot fail a transfer, and copying nothing would let the
    engine compute on bytes that are not the block's."""

    def __init__(self, spec: KvtierOffloadingSpec, kv_caches: vc.CanonicalKVCaches, rank: int) -> None:  # noqa: D107
        self._spec = spec
        self._kv = kv_caches
        self._rank = rank
        self._pending: set[int] = set()
        self._done: list[vc.TransferResult] = []
        self._inner: vc.OffloadingWorker | None = None
        self.epoch: int | None = None
        self.remaps = 0
        self._map(None)

    def _map(self, epoch: int | None) -> None:
        region = self._spec.arena_region(self._rank, epoch)
        try:
            inner: vc.OffloadingWorker
            if vc.current_platform.is_cuda_alike() or vc.current_platform.is_xpu():
                inner = vc.CPUOffloadingWorker(
                    kv_caches=self._kv, blocks_per_chunk=self._spec.blocks_per_chunk, num_cpu_chunks=region.num_chunks,
                    mmap_region=region, canonical_layout=bool(getattr(self._spec.config, "canonical_layout", False)),
                )
            else:
                from kvtier.vllm.worker import HostCopyWorker

                inner = HostCopyWorker(self._kv, self._spec.blocks_per_chunk, region)
        except Exception:
            region.cleanup()
            raise
        if self._inner is not None:
            self._retire()
            self.remaps += 1
            log.warning("kvtier: worker rank %d maps the arena of epoch %016x (was %016x)", self._rank, region.epoch,
                        self.epoch or 0)
        self._inner, self.epoch = inner, region.epoch

    def _retire(self) -> None:
        """Waits for every transfer of the current mapping, keeps their
        results, and unmaps it."""
        inner = self._mapped()
        if self._pending:
            inner.wait(set(self._pending))
        self._collect(inner)
        inner.shutdown()
        self._inner = None

    def _mapped(self) -> vc.OffloadingWorker:
        if self._inner is None:
            raise RuntimeError("kvtier: the worker has no arena mapped")
        return self._inner

    def _collect(self, inner: vc.OffloadingWorker) -> None:
        for r in inner.get_finished():
            self._pending.discard(r.job_id)
            self._done.append(r)

    def _ready(self, spec: vc.LoadStoreSpec) -> bool:
        e = getattr(spec, "epoch", None)
        if e is None or e == self.epoch:
            return True
        try:
            self._map(e)
            return True
        except _region.DaemonUnavailable as err:
            log.warning("kvtier: %s", err)
            return False

    def submit_store(self, job_id: int, src_spec: vc.GPULoadStoreSpec, dst_spec: vc.LoadStoreSpec) -> bool:
        if not self._ready(dst_spec):
            # Never bound (its link is gone): skipping the copy loses
            # nothing, and no one reads the slot.
            self._done.append(vc.TransferResult(job_id=job_id, success=True, transfer_size=0, transfer_time=0.0))
            return True
        self._pending.add(job_id)
        return self._mapped().submit_store(job_id, src_spec, dst_spec)

    def submit_load(self, job_id: int, src_spec: vc.LoadStoreSpec, dst_spec: vc.GPULoadStoreSpec, expedited: bool = False) -> bool:
        if not self._ready(src_spec):
            raise RuntimeError(
                f"kvtier: load job {job_id} reads slots of epoch {getattr(src_spec, 'epoch', 0):016x}, whose arena is gone (the daemon "
                "restarted twice within a step); vLLM cannot fail a transfer, and the engine must not compute on "
                "bytes that are not the block's")
        self._pending.add(job_id)
        return self._mapped().submit_load(job_id, src_spec, dst_spec, expedited=expedited)

    def get_finished(self) -> list[vc.TransferResult]:
        if self._inner is not None:
            self._collect(self._inner)
        out, self._done = self._done, []
        return out

    def wait(self, job_ids: set[int]) -> None:
        ids = job_ids & self._pending
        if ids and self._inner is not None:
            self._inner.wait(ids)

    def shutdown(self) -> None:
        if self._inner is not None:
            self._retire()


class ArenaRegion(vc.SharedOffloadRegion):
    """The daemon's arena presented as vLLM's SharedOffloadRegion, so that
    vLLM's own worker (or HostCopyWorker) copies into it: rows of
    row_stride bytes, one cell of cpu_page_size per worker rank, the
    canonical tensors back to back. It sets the private fields vLLM's
    region methods read (pinned in tests/test_compat.py) instead of
    creating a /dev/shm file."""

    def __init__(self, fd: int, num_chunks: int, row_stride: int, cpu_page_size: int, rank: int | None,
                 epoch: int = 0) -> None:  # noqa: D107
        import torch

        self.epoch = epoch
        self.page_size = PAGESIZE
        self.num_chunks = num_chunks
        self._row_stride = row_stride
        self.total_size_bytes = num_chunks * row_stride
        self.cpu_page_size = cpu_page_size
        self.mmap_path = f"kvtier-arena:fd{fd}"
        self._segments = [(self.mmap_path, 0, self.total_size_bytes)]
        self._creator = False
        self.rank = rank
        if rank is not None:
            self._worker_offset = rank * cpu_page_size
            self._worker_area_end = (rank + 1) * cpu_page_size
        self.fd = fd  # owned: cleanup closes it
        self.mmap_obj = mmap.mmap(self.fd, self.total_size_bytes, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        self._base = torch.frombuffer(memoryview(self.mmap_obj), dtype=torch.int8)
        self._views = []
        self._canonical_offset = 0
        self.is_pinned = False
        self.pinned_addresses = []
