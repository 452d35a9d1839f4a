"""A host pool's pages as kvtier sees them: the layout an SGLang backend
attaches (a page is one slot of the daemon's arena), the kvtier key of a
page's hash, and the copies of a page's tensor into and out of a slot,
run by contiguous run of memory."""

from __future__ import annotations

import ctypes
import hashlib
import itertools
from typing import Any, List

_PAGE = 4096  # the daemon's slots are whole memory pages


def storage_key(key: str) -> bytes:
    """A page hash as a 32-byte kvtier key."""
    if len(key) == 64:
        try:
            return bytes.fromhex(key)
        except ValueError:
            pass
    return hashlib.sha256(key.encode()).digest()


def pack_keys(keys: List[str]) -> bytes:
    """The keys' storage keys back to back (one conversion for a batch of
    SGLang's hex hashes)."""
    if all(len(k) == 64 for k in keys):
        try:
            return bytes.fromhex("".join(keys))
        except ValueError:
            pass
    return b"".join(storage_key(k) for k in keys)


def runs(t: Any) -> list[tuple[int, int]]:
    """The (address, bytes) runs a CPU tensor's elements occupy, in C
    order: one run for a contiguous tensor, 2 for a page_first page (its
    K and V halves), 2 x layers for a layer_first page."""
    shape, strides, item = list(t.shape), list(t.stride()), t.element_size()
    k, span = len(shape), 1
    while k > 0 and (shape[k - 1] == 1 or strides[k - 1] == span):
        span *= shape[k - 1]
        k -= 1
    base, n = t.data_ptr(), span * item
    if k == 0:
        return [(base, n)]
    return [(base + item * sum(i * st for i, st in zip(idx, strides[:k])), n)
            for idx in itertools.product(*(range(d) for d in shape[:k]))]


def copy_out(slot_addr: int, src: Any) -> None:
    """Copies tensor src into the bytes at slot_addr."""
    pos = 0
    for addr, n in runs(src):
        ctypes.memmove(slot_addr + pos, addr, n)
        pos += n


def copy_in(dst: Any, slot_addr: int) -> None:
    """Copies the bytes at slot_addr into tensor dst."""
    pos = 0
    for addr, n in runs(dst):
        ctypes.memmove(addr, slot_addr + pos, n)
        pos += n


def layout_of(host: Any, config: Any) -> tuple[dict[str, Any], int]:
    """The EngineAttach layout of a host pool, and a page's bytes."""
    page = host.get_data_page(0, flat=False)
    page_bytes = page.numel() * page.element_size()
    mla = bool(config.is_mla_model)
    shard = "replicated" if mla else f"tp{config.tp_rank}of{config.tp_size}"
    if config.pp_size > 1:
        shard += f"/pp{config.pp_rank}of{config.pp_size}"
    if config.attn_cp_size > 1:
        shard += f"/cp{config.attn_cp_rank}of{config.attn_cp_size}"
    if config.dcp_size > 1:
        shard += f"/dcp{config.dcp_rank}of{config.dcp_size}"
    layers = f"{getattr(host, 'start_layer', 0)}-{getattr(host, 'end_layer', getattr(host, 'layer_num', 0))}"
    identity = ":".join([
        "sglang", str(host.layout), type(host).__name__, "x".join(str(d) for d in page.shape), "layers" + layers, shard,
    ])
    tp = 1 if mla else int(config.tp_size)
    return {
        "num_blocks": 1,
        "row_stride": -(-page_bytes // _PAGE) * _PAGE,
        "blocks_per_chunk": 1,
        "tokens_per_block": int(host.page_size),
        "tokens_per_hash": int(host.page_size),
        "model": (config.model_name or "unnamed")[:512],
        "dtype": str(host.dtype).removeprefix("torch."),
        "world_size": tp,
        "tp": tp,
        "pp": int(config.pp_size),
        "pcp": int(config.attn_cp_size),
        "dcp": int(config.dcp_size),
        "replicated_layout": mla,
        "canonical_layout": False,
        "cpu_page_size": 0,
        "kv_cache_layout": identity,
    }, page_bytes
