"""KvtierOffloadingSpec: kvtier as vLLM's whole offloading spec (manager
mode). kvtier's primary *is* the CPU cache vLLM's worker copies GPU blocks
into, shared by every engine attached to the daemon with the same layout.

    {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
     "kv_connector_extra_config": {"spec_name": "KvtierOffloadingSpec",
       "kvtier": {"target": "unix:///run/kvtier/kvtier.sock"}}}

The spec computes vLLM's chunk layout from the engine's config, attaches
to (or has the daemon create) the namespace whose slots fit it, and maps
the daemon's arena. get_manager() returns KvtierProxyManager, which talks
to the daemon once per step, off the scheduler thread; get_worker() copies
with vLLM's CPUOffloadingWorker on CUDA/XPU, with HostCopyWorker on the CPU
backend.
"""

from __future__ import annotations

import json
import mmap
import os
from typing import Any

from kvtier.vllm import _compat as vc
from kvtier.vllm import _region

PAGESIZE = mmap.PAGESIZE


def _round_up(n: int, to: int) -> int:
    return (n + to - 1) // to * to


class KvtierOffloadingSpec(vc.OffloadingSpec):
    """Keys of ``kv_connector_extra_config["kvtier"]``: ``target`` (the
    daemon's Unix socket), ``token``, ``timeout_s`` (10), ``lease_steps``
    (how many steps an unused lookup lease is kept, 8), ``min_free_slots``
    (the smallest pool of leased store slots, 64)."""

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        kc = dict(self.extra_config.get("kvtier") or {})
        self._target = kc.pop("target", "unix:///run/kvtier/kvtier.sock")
        self._token = kc.pop("token", None)
        self._timeout = float(kc.pop("timeout_s", 10.0))
        self._lease_steps = int(kc.pop("lease_steps", 8))
        self._min_free = int(kc.pop("min_free_slots", 64))
        if kc:
            raise ValueError(f"kvtier spec: unknown key(s) {sorted(kc)} in kv_connector_extra_config.kvtier "
                             "(known: target, token, timeout_s, lease_steps, min_free_slots)")
        self._path = _region.unix_path(self._target)
        par = config.parallel
        self.replicated_layout = bool(config.replicated_layout)
        num_copies = 1 if self.replicated_layout else par.world_size
        unaligned = config.worker_kv_bytes_per_block * num_copies * self.blocks_per_chunk
        self.cpu_page_size_per_worker = unaligned // max(num_copies, 1)
        self.kv_bytes_per_chunk = _round_up(unaligned, PAGESIZE)
        self._manager: Any = None
        self._worker: Any = None
        self._client: Any = None
        self.namespace, self.num_chunks, self._fd_socket = self._attach()

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

    def _attach(self) -> tuple[str, int, str]:
        import grpc

        from kvtier.v1 import kvtier_pb2 as pb

        c = self.client()
        try:
            rep = c.stub.EngineAttach(pb.EngineAttachRequest(layout=json.dumps(self._layout())), timeout=self._timeout,
                                      metadata=c._md)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.UNAVAILABLE:
                raise _region.DaemonUnavailable(
                    f"kvtier spec: no kvtier daemon at {self._target} (is `kvtier serve` running there?): {e.details()}") from e
            raise RuntimeError(f"kvtier spec: the daemon at {self._target} refused the engine: {e.code().name}: {e.details()}") from e
        if rep.slot_size != self.kv_bytes_per_chunk:
            raise RuntimeError(f"kvtier spec: namespace {rep.namespace} has {rep.slot_size}-byte slots, the engine's chunks are {self.kv_bytes_per_chunk} bytes")
        return rep.namespace, int(rep.num_slots), rep.fd_socket

    def client(self) -> Any:
        if self._client is None:
            import kvtier

            self._client = kvtier.Client("unix://" + self._path, token=self._token)
        return self._client

    def get_manager(self) -> Any:
        if self._manager is None:
            from kvtier.vllm.manager import KvtierProxyManager

            self._manager = KvtierProxyManager(self)
        return self._manager

    def arena_region(self, rank: int) -> "ArenaRegion":
        """The daemon's arena as a vLLM region, for this worker rank."""
        import kvtier

        fd, _ = kvtier.receive_arena_fd(self._fd_socket, self.namespace)
        return ArenaRegion(fd, self.num_chunks, self.kv_bytes_per_chunk, self.cpu_page_size_per_worker, rank)

    def get_worker(self, kv_caches: Any) -> Any:
        if self._worker is None:
            rank = 0 if self.replicated_layout else self.config.parallel.rank
            region = self.arena_region(rank)
            try:
                if vc.current_platform.is_cuda_alike() or vc.current_platform.is_xpu():
                    self._worker = vc.CPUOffloadingWorker(
                        kv_caches=kv_caches, blocks_per_chunk=self.blocks_per_chunk, num_cpu_chunks=self.num_chunks,
                        mmap_region=region, canonical_layout=bool(getattr(self.config, "canonical_layout", False)),
                    )
                else:
                    from kvtier.vllm.worker import HostCopyWorker

                    self._worker = HostCopyWorker(kv_caches, self.blocks_per_chunk, region)
            except Exception:
                region.cleanup()
                raise
        return self._worker


class ArenaRegion(vc.SharedOffloadRegion):
    """The daemon's arena presented as vLLM's SharedOffloadRegion, so that
    vLLM's own worker (or HostCopyWorker) copies into it: rows of
    row_stride bytes, one cell of cpu_page_size per worker rank, the
    canonical tensors back to back. It sets the private fields vLLM's
    region methods read (pinned in tests/test_compat.py) instead of
    creating a /dev/shm file."""

    def __init__(self, fd: int, num_chunks: int, row_stride: int, cpu_page_size: int, rank: int | None) -> None:  # noqa: D107
        import torch

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
