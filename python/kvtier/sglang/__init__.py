"""kvtier as SGLang's HiCache storage backend (L3).

SGLang loads it without patches::

    python -m sglang.launch_server ... --enable-hierarchical-cache \\
      --hicache-storage-backend dynamic \\
      --hicache-storage-backend-extra-config '{"backend_name": "kvtier",
        "module_path": "kvtier.sglang", "class_name": "KvtierHiCacheStorage",
        "target": "unix:///run/kvtier/kvtier.sock"}'

The class lives in kvtier.sglang.storage; it is imported on first use so
that importing this package loads neither torch nor SGLang.
"""

from typing import Any

__all__ = ["KvtierHiCacheStorage"]


def __getattr__(name: str) -> Any:
    if name == "KvtierHiCacheStorage":
        from kvtier.sglang.storage import KvtierHiCacheStorage

        return KvtierHiCacheStorage
    raise AttributeError(f"module 'kvtier.sglang' has no attribute {name!r}")
