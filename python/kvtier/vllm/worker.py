"""A host-memory OffloadingWorker and the tier-mode spec that uses it.

vLLM's CPUOffloadingWorker copies between GPU memory and the CPU region
with CUDA/XPU kernels; vLLM's spec refuses to build it elsewhere. On the CPU
backend the engine's "GPU" KV cache is host memory too, and a copy between
two host tensors is all a transfer is. HostCopyWorker does that copy, over
the same region rows and cell layout as vLLM's worker (one cell per rank,
the canonical tensors back to back), synchronously: every job is finished
when its submit returns.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from kvtier.vllm import _compat as vc


class HostCopyWorker(vc.OffloadingWorker):
    """Copies KV blocks between host "GPU" tensors and region rows."""

    def __init__(self, kv_caches: vc.CanonicalKVCaches, blocks_per_chunk: int, region: vc.SharedOffloadRegion) -> None:
        self._region = region
        self._bpc = blocks_per_chunk
        self._gpu: list[torch.Tensor] = []
        self._cpu: list[torch.Tensor] = []
        for t in kv_caches.tensors:
            if t.tensor.device.type != "cpu":
                raise RuntimeError(f"HostCopyWorker copies host memory; a KV cache tensor is on {t.tensor.device}")
            page = t.page_size_bytes
            self._gpu.append(t.tensor.view(torch.int8).view(-1, page))
            # (num_chunks, blocks_per_chunk, page): one row per chunk.
            self._cpu.append(region.create_next_worker_view(page * blocks_per_chunk).view(-1, blocks_per_chunk, page))
        self._done: list[vc.TransferResult] = []

    def _pairs(self, gpu_spec: vc.GPULoadStoreSpec, chunk_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(gpu block, chunk, sub-block) triples of a transfer. A load's first
        chunk may be used from a sub-block on (its GPU blocks start
        unaligned); the GPU blocks are in order."""
        blocks = np.asarray(gpu_spec.block_ids, dtype=np.int64)
        sizes = getattr(gpu_spec, "group_sizes", None)
        if sizes is not None and len(sizes) > 1:
            raise NotImplementedError("HostCopyWorker: several KV cache groups in one transfer")
        total = len(chunk_ids) * self._bpc
        skip = total - len(blocks)
        if skip < 0 or skip >= self._bpc and len(blocks) > 0:
            raise ValueError(f"HostCopyWorker: {len(blocks)} GPU blocks for {len(chunk_ids)} chunks of {self._bpc}")
        pos = np.arange(skip, total)
        return blocks, np.asarray(chunk_ids, dtype=np.int64)[pos // self._bpc], pos % self._bpc

    def _finish(self, job_id: int, nbytes: int, t0: float) -> bool:
        self._done.append(vc.TransferResult(job_id=job_id, success=True, transfer_size=nbytes, transfer_time=time.monotonic() - t0))
        return True

    def submit_store(self, job_id: int, src_spec: vc.GPULoadStoreSpec, dst_spec: vc.LoadStoreSpec) -> bool:
        t0 = time.monotonic()
        blocks, chunks, sub = self._pairs(src_spec, _chunks(dst_spec))
        n = 0
        for g, c in zip(self._gpu, self._cpu):
            c[chunks, sub] = g[blocks]
            n += len(blocks) * g.shape[1]
        return self._finish(job_id, n, t0)

    def submit_load(self, job_id: int, src_spec: vc.LoadStoreSpec, dst_spec: vc.GPULoadStoreSpec, expedited: bool = False) -> bool:
        t0 = time.monotonic()
        blocks, chunks, sub = self._pairs(dst_spec, _chunks(src_spec))
        n = 0
        for g, c in zip(self._gpu, self._cpu):
            g[blocks] = c[chunks, sub]
            n += len(blocks) * g.shape[1]
        return self._finish(job_id, n, t0)

    def get_finished(self) -> list[vc.TransferResult]:
        out, self._done = self._done, []
        return out

    def wait(self, job_ids: set[int]) -> None:
        return  # every job is finished when submitted

    def shutdown(self) -> None:
        # The views export the mapping: drop them, or it cannot be unmapped.
        self._cpu.clear()
        self._gpu.clear()
        self._region.cleanup()


class KvtierTieringOffloadingSpec(vc.TieringOffloadingSpec):
    """vLLM's TieringOffloadingSpec, with a host-copy worker where vLLM has
    none (the CPU backend): select it with ``"spec_name":
    "KvtierTieringOffloadingSpec", "spec_module_path": "kvtier.vllm"``. On
    CUDA/XPU it is vLLM's spec unchanged."""

    def get_worker(self, kv_caches: vc.CanonicalKVCaches) -> vc.OffloadingWorker:
        if vc.current_platform.is_cuda_alike() or vc.current_platform.is_xpu():
            return super().get_worker(kv_caches)
        w: vc.OffloadingWorker | None = self._worker
        if w is None:
            rank = 0 if self.replicated_layout else self.config.parallel.rank
            region = vc.SharedOffloadRegion(
                engine_id=self._engine_id, num_chunks=self.num_chunks, rank=rank,
                kv_bytes_per_chunk=self.kv_bytes_per_chunk, cpu_page_size=self.cpu_page_size_per_worker,
            )
            try:
                w = HostCopyWorker(kv_caches, self.blocks_per_chunk, region)
            except Exception:
                region.cleanup()
                raise
            # vLLM's attribute is typed as its CUDA worker; this spec puts
            # the host-memory copy worker in its place.
            self._worker = w  # type: ignore[assignment]
        return w


def _chunks(spec: vc.LoadStoreSpec) -> np.ndarray:
    """The CPU chunk indices of the CPU side of a transfer (vLLM's
    CPULoadStoreSpec, or kvtier's KvtierSlotSpec)."""
    if not isinstance(spec, vc.CPULoadStoreSpec):
        raise TypeError(f"kvtier: a host copy needs a CPU chunk spec, got {type(spec).__name__}")
    return spec.block_ids
