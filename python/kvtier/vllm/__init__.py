"""kvtier for vLLM.

Tier mode: kvtier as one out-of-tree secondary tier of vLLM's
TieringOffloadingSpec (``KvtierSecondaryTier``)::

    {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
     "kv_connector_extra_config": {"spec_name": "TieringOffloadingSpec",
       "cpu_bytes_to_use": 34359738368,
       "secondary_tiers": [{"type": "kvtier", "target": "unix:///run/kvtier/kvtier.sock"}]}}

``"type": "KvtierSecondaryTier", "module_path": "kvtier.vllm"`` works without
the entry point. On vLLM's CPU backend, where vLLM's spec builds no worker,
``"spec_name": "KvtierTieringOffloadingSpec", "spec_module_path":
"kvtier.vllm"`` is TieringOffloadingSpec with a host-copy worker.

Manager mode: kvtier as vLLM's whole offloading spec, its primary the CPU
cache every engine on the node shares (``KvtierOffloadingSpec``)::

    {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
     "kv_connector_extra_config": {"spec_name": "KvtierOffloadingSpec",
       "kvtier": {"target": "unix:///run/kvtier/kvtier.sock"}}}

Importing this package imports nothing of vLLM (vLLM's API server imports
tier modules only to read metric definitions): the classes load on first
attribute access.
"""

from __future__ import annotations

from typing import Any

__all__ = ["KvtierSecondaryTier", "KvtierTieringOffloadingSpec", "KvtierOffloadingSpec", "KvtierProxyManager", "HostCopyWorker"]

_LAZY = {
    "KvtierOffloadingSpec": "kvtier.vllm.spec",
    "KvtierProxyManager": "kvtier.vllm.manager",
    "KvtierSecondaryTier": "kvtier.vllm.tier",
    "KvtierTieringOffloadingSpec": "kvtier.vllm.worker",
    "HostCopyWorker": "kvtier.vllm.worker",
}


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'kvtier.vllm' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(mod), name)
