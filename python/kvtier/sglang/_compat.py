"""Every SGLang symbol kvtier.sglang uses, in one place.

kvtier.sglang is tested against sglang 0.5.23 (python/tests/test_sglang.py;
``SGLANG_VERSION``). When SGLang moves one of these, this module is the
only one to change.
"""

from __future__ import annotations

from sglang.srt.mem_cache.hicache_storage import (  # noqa: F401
    HiCacheStorage,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
    PoolName,
    PoolTransfer,
    PoolTransferResult,
)

SGLANG_VERSION = "0.5.23"

#: Keys of ``--hicache-storage-backend-extra-config`` that SGLang itself
#: reads (the dynamic factory, the cache controllers); the backend accepts
#: them beside its own.
SGLANG_KEYS = frozenset({
    "backend_name",
    "module_path",
    "class_name",
    "interface_v1",
    "tp_lcm_size",
    "prefetch_threshold",
    "prefetch_timeout_base",
    "prefetch_timeout_per_ki_token",
    "hicache_storage_pass_prefix_keys",
})

#: The controller's zero-copy switch: with it, SGLang calls
#: ``batch_get_v1`` / ``batch_set_v1`` with host-pool indices (read by
#: HiCacheController.attach_storage_backend after the backend is built).
INTERFACE_V1 = "interface_v1"

KV_POOL = PoolName.KV
