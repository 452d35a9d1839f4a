"""Keys from token ids: the keys kvtier holds a prompt's blocks under when
vLLM 0.33's offloading connector feeds it, for routers and agents that
want to ask a daemon about a prompt before an engine has seen it.

``keys_from_tokens`` hashes the prompt with vLLM's own functions when vllm
is importable (imported on first use, never at import time); else, for
the default ``sha256``, as vLLM does it (pickle protocol 5 and SHA-256,
with this interpreter's pickle: a router need not install vLLM); else
with the daemon binary's ``kvtier keys`` (the Go implementation, package
blockhash, tested byte for byte against vLLM). See ``kvtier keys --help``
for what each input must match on the engine.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Sequence
from typing import Any

DEFAULT_SEED = "vllm-none-hash"


def keys_from_tokens(
    tokens: Sequence[int],
    *,
    block_size: int,
    tokens_per_key: int | None = None,
    hash_algo: str = "sha256",
    seed: str | None = None,
    cache_salt: str | None = None,
    lora_name: str | None = None,
    lora_path: str = "",
    group: int = 0,
    binary: str | None = None,
) -> list[bytes]:
    """The offload keys of ``tokens``' full chunks, in prefix order.

    ``block_size`` is the engine's hash block size, ``tokens_per_key`` the
    offloading connector's block size (default ``block_size``), ``seed``
    the engine's PYTHONHASHSEED (default: unset), ``lora_name`` set for a
    LoRA request. With ``binary`` (a kvtier binary's path) the Go
    implementation answers even where vllm is importable.
    """
    per = tokens_per_key or block_size
    if seed == "":
        raise ValueError("seed: an empty PYTHONHASHSEED is not supported (unset it, or set a value)")
    if block_size <= 0 or per % block_size:
        raise ValueError(
            f"tokens_per_key {per} is not a multiple of block_size {block_size}")
    if binary is None:
        try:
            return _keys_vllm(tokens, block_size, per, hash_algo, seed,
                              cache_salt, lora_name, lora_path, group)
        except ImportError:
            if hash_algo == "sha256":
                return _keys_pickle(tokens, block_size, per, seed, cache_salt,
                                    lora_name, lora_path, group)
    return _keys_binary(tokens, block_size, per, hash_algo, seed, cache_salt,
                        lora_name, lora_path, group, binary)


def _keys_vllm(tokens: Sequence[int], block_size: int, per: int, hash_algo: str,
               seed: str | None, cache_salt: str | None, lora_name: str | None,
               lora_path: str, group: int) -> list[bytes]:
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import BlockHash, hash_block_tokens
    from vllm.v1.kv_offload.base import make_offload_key

    fn = get_hash_fn_by_name(hash_algo)
    # vLLM's NONE_HASH is derived here (fn(seed)) rather than read from its
    # module global, set only inside an engine, from that engine's algorithm.
    return _chain(tokens, block_size, per, seed, cache_salt, lora_name, lora_path,
                  fn, lambda parent, block, extra: bytes(hash_block_tokens(fn, BlockHash(parent), block, extra)),
                  lambda h: bytes(make_offload_key(h, group)))


def _keys_pickle(tokens: Sequence[int], block_size: int, per: int, seed: str | None,
                 cache_salt: str | None, lora_name: str | None, lora_path: str,
                 group: int) -> list[bytes]:
    """vLLM's sha256 block hashes without vLLM: SHA-256 of the pickle
    (protocol 5) of (parent hash, block tokens, extra keys)."""
    import hashlib
    import pickle

    def h(x: object) -> bytes:
        return hashlib.sha256(pickle.dumps(x, protocol=5)).digest()

    return _chain(tokens, block_size, per, seed, cache_salt, lora_name, lora_path,
                  h, lambda parent, block, extra: h((parent, tuple(block), extra)),
                  lambda hv: hv + group.to_bytes(4, "big"))


def _chain(tokens: Sequence[int], block_size: int, per: int, seed: str | None,
           cache_salt: str | None, lora_name: str | None, lora_path: str,
           none_hash: Callable[[str], bytes],
           block_hash: Callable[[bytes, Sequence[int], tuple[Any, ...] | None], bytes],
           key: Callable[[bytes], bytes]) -> list[bytes]:
    """vLLM's request block hasher over full blocks (NONE_HASH from the
    seed; LoRA keys on every block, the salt on the first), then the
    offloading connector's key of each chunk's last block."""
    parent = none_hash(seed if seed is not None else DEFAULT_SEED)
    lora: list[tuple[Any, ...]] = (
        [("lora", lora_name, lora_path)] if lora_name is not None else [])
    hashes = []
    for start in range(0, len(tokens) - block_size + 1, block_size):
        extra = lora + ([("cache_salt", cache_salt)]
                        if start == 0 and cache_salt else [])
        parent = block_hash(parent, tokens[start:start + block_size],
                            tuple(extra) if extra else None)
        hashes.append(parent)
    step = per // block_size
    return [key(hv) for hv in hashes[step - 1::step]]


def _keys_binary(tokens: Sequence[int], block_size: int, per: int, hash_algo: str,
                 seed: str | None, cache_salt: str | None, lora_name: str | None,
                 lora_path: str, group: int, binary: str | None) -> list[bytes]:
    if binary is None:
        from kvtier.__main__ import binary as carried

        b = carried()
        binary = str(b) if b is not None else os.environ.get("KVTIER_BIN")
    if not binary:
        raise RuntimeError(
            "kvtier.keys: vllm is not importable and this installation has no kvtier binary "
            "(install a platform wheel, or pass binary=)")
    args = [binary, "keys", "--block-size", str(block_size), "--tokens-per-key", str(per),
            "--hash-algo", hash_algo, "--group", str(group)]
    if seed is not None:
        args += ["--seed", seed]
    if cache_salt:
        args += ["--cache-salt", cache_salt]
    if lora_name is not None:
        args += ["--lora-name", lora_name, "--lora-path", lora_path]
    out = subprocess.run(args, input=json.dumps(list(tokens)) + "\n", capture_output=True,
                         text=True, check=False)
    if out.returncode != 0:
        raise ValueError(f"kvtier keys: {out.stderr.strip()}")
    line = json.loads(out.stdout)
    if "error" in line:
        raise ValueError(f"kvtier keys: {line['error']}")
    return [bytes.fromhex(k) for k in line["keys"]]
