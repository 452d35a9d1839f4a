"""Keys from token ids (kvtier.keys, `kvtier keys`, Go package blockhash)
against the installed vLLM: its Request with its own block hasher, and its
offloading connector's key per chunk (the hash of the chunk's last block
and the KV-cache group), for 1 200 random prompts with and without cache
salts and LoRA adapters, with both cryptographic hash algorithms."""

from __future__ import annotations

import json
import os
import random
import subprocess
from typing import Any

import pytest

from kvtier.keys import keys_from_tokens

vllm = pytest.importorskip("vllm")


def _vllm_keys(prompt: dict[str, Any], block_size: int, per: int, algo: str, group: int) -> list[bytes]:
    """The keys as vLLM's scheduler makes them for this prompt."""
    from vllm import SamplingParams
    from vllm.lora.request import LoRARequest
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.kv_offload.base import make_offload_key
    from vllm.v1.request import Request

    fn = get_hash_fn_by_name(algo)
    kv_cache_utils.init_none_hash(fn)
    lora = None
    if "lora_name" in prompt:
        lora = LoRARequest(prompt["lora_name"], 1, prompt["lora_path"])
    req = Request("r", prompt["tokens"], SamplingParams(), None, lora_request=lora,
                  cache_salt=prompt.get("cache_salt"),
                  block_hasher=kv_cache_utils.get_request_block_hasher(block_size, fn))
    step = per // block_size
    return [bytes(make_offload_key(h, group)) for h in req.block_hashes[step - 1::step]]


def _random_prompts(rng: random.Random, n: int) -> list[dict[str, Any]]:
    def token() -> int:
        # Every integer encoding pickle and CBOR have for token ids.
        return rng.choice([rng.randrange(256), rng.randrange(65536), rng.randrange(1 << 31),
                           rng.randrange(1 << 31, 1 << 40), 23, 24, 255, 256, 65535, 65536])

    def text() -> str:
        s = rng.choice(["", "a", "é", "lora", "salt-" + str(rng.randrange(1000)),
                        "ü" * rng.randrange(1, 40), "x" * rng.randrange(250, 300)])
        # A new object, as a string decoded from a request is: pickle
        # refers back to an object it has written (the interned literal
        # "lora" of vLLM's key), never to an equal one.
        return "".join(list(s))

    prompts = []
    for _ in range(n):
        p: dict[str, Any] = {"tokens": [token() for _ in range(rng.randrange(0, 200))]}
        if rng.random() < 0.4:
            p["cache_salt"] = text() or "s"
        if rng.random() < 0.4:
            p["lora_name"], p["lora_path"] = text(), text() or "/p"
        prompts.append(p)
    return prompts


@pytest.mark.parametrize("algo", ["sha256", "sha256_cbor"])
@pytest.mark.parametrize("block_size,per,group", [(4, 4, 0), (16, 64, 0), (8, 16, 3)])
def test_go_keys_match_vllm(kvtier_bin: str, algo: str, block_size: int, per: int, group: int) -> None:
    rng = random.Random(f"{algo}-{block_size}-{per}")
    prompts = _random_prompts(rng, 200)
    args = [kvtier_bin, "keys", "--block-size", str(block_size), "--tokens-per-key", str(per),
            "--hash-algo", algo, "--group", str(group), "--hashes"]
    if (seed := os.environ.get("PYTHONHASHSEED")) is not None:
        args += ["--seed", seed]
    out = subprocess.run(args, input="".join(json.dumps(p) + "\n" for p in prompts),
                         capture_output=True, text=True, check=True)
    lines = out.stdout.splitlines()
    assert len(lines) == len(prompts)
    nonempty = 0
    for p, line in zip(prompts, lines):
        got = [bytes.fromhex(k) for k in json.loads(line)["keys"]]
        want = _vllm_keys(p, block_size, per, algo, group)
        assert got == want, (p, line)
        nonempty += bool(want)
    assert nonempty > len(prompts) // 2


def test_python_helper_matches_vllm_both_ways(kvtier_bin: str) -> None:
    rng = random.Random(7)
    seed = os.environ.get("PYTHONHASHSEED")
    for p in _random_prompts(rng, 30):
        kw: dict[str, Any] = dict(block_size=16, tokens_per_key=32, seed=seed,
                                  cache_salt=p.get("cache_salt"),
                                  lora_name=p.get("lora_name"), lora_path=p.get("lora_path", ""))
        want = _vllm_keys(p, 16, 32, "sha256", 0)
        assert keys_from_tokens(p["tokens"], **kw) == want
        assert keys_from_tokens(p["tokens"], binary=kvtier_bin, **kw) == want


def test_python_without_vllm_matches_vllm() -> None:
    from kvtier.keys import _keys_pickle

    rng = random.Random(11)
    seed = os.environ.get("PYTHONHASHSEED")
    for p in _random_prompts(rng, 100):
        want = _vllm_keys(p, 8, 16, "sha256", 2)
        got = _keys_pickle(p["tokens"], 8, 16, seed, p.get("cache_salt"), p.get("lora_name"), p.get("lora_path", ""), 2)
        assert got == want, p


def test_bad_options_are_refused_with_a_reason(kvtier_bin: str) -> None:
    for args, want in [
        (["--block-size", "16", "--tokens-per-key", "24"], "not a multiple"),
        (["--block-size", "16", "--hash-algo", "xxhash"], "hash algorithm"),
        (["--block-size", "0"], "hash block size"),
    ]:
        out = subprocess.run([kvtier_bin, "keys", *args], input="[1]\n", capture_output=True, text=True)
        assert out.returncode != 0 and want in out.stderr, (args, out.stderr)
    out = subprocess.run([kvtier_bin, "keys", "--block-size", "2"], input='[1, 2]\n{"tokens": "x"}\n[1, 2, 3, 4]\n',
                         capture_output=True, text=True, check=True)
    lines = [json.loads(x) for x in out.stdout.splitlines()]
    assert len(lines[0]["keys"]) == 1 and "error" in lines[1] and len(lines[2]["keys"]) == 2
    with pytest.raises(ValueError):
        keys_from_tokens([1, 2, 3], block_size=2, tokens_per_key=3)


def test_residency_of_a_prompt_from_python(kvtier_bin: str) -> None:
    import pathlib
    import tempfile

    from conftest import Daemon, wait_until

    d = pathlib.Path(tempfile.mkdtemp(prefix="kvt"))
    dm = Daemon(kvtier_bin, d, f"""
namespace: {{model: m, bytes_per_block: 4KiB}}
primary: {{bytes: 64KiB}}
secondary_tiers: [{{name: dram, type: memory, medium: cpu, locality: remote}}]
server: {{unix_socket: {d}/k.sock, tcp_addr: "", metrics_addr: ""}}
""").start()
    try:
        keys = keys_from_tokens(list(range(64)), block_size=16, cache_salt="tenant-a")
        assert len(keys) == 4
        with dm.client() as c:
            c.put_blocks([(k, bytes(4096)) for k in keys[:3]], params={"kv_store_tiers": []})
            r = c.residency(keys)
            assert (r.primary, r.loadable) == (3, 3)
            assert [(t.name, t.allowed, t.known, t.run) for t in r.tiers] == [("dram", True, True, 0)]
            r = c.residency(keys, params={"kv_load_tiers": "cpu"})
            assert r.loadable == 3 and len(r.warnings) == 1
            # Another salt, other keys: nothing held.
            other = keys_from_tokens(list(range(64)), block_size=16, cache_salt="tenant-b")
            assert c.residency(other).loadable == 0
            assert c.stats().primary.lookups == 0
            # Into the memory tier, out of the primary, back by prefetch.
            c.put_blocks([(keys[3], bytes(4096))], params={"kv_store_tiers": [{"medium": "cpu"}]})
            wait_until(lambda: c.stats().tiers[0].cascades_ok >= 1, what="the cascade to dram")
            c.reset()
            assert c.residency(keys).primary == 0
            a = c.prefetch(keys[3:], deadline_ms=60_000)
            assert a.present + a.started == 1 or a.queued
            wait_until(lambda: c.residency(keys[3:]).primary == 1, what="the prefetched block")
            # Pinned, it outlives a reset; unpinned, it does not.
            pr = c.pin(keys, ttl_ms=60_000)
            assert (pr.pinned, pr.missing, pr.refused) == (1, 3, 0)
            c.reset()
            assert c.residency(keys[3:]).primary == 1 and c.stats().router_pinned_blocks == 1
            assert c.unpin(keys) == 1
            c.reset()
            assert c.residency(keys[3:]).primary == 0
            # Deleted: in no tier, nothing for a prefetch to find.
            d = c.delete(keys)
            assert [(t.name, t.supported, t.removed) for t in d.tiers] == [("dram", True, 1)]
            assert c.prefetch(keys[3:]).started == 0
            assert c.residency(keys[3:]).tiers[0].run == 0
    finally:
        dm.stop()
