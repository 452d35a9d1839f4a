"""Generates vllm_golden.json: the bytes vLLM's own msgspec encoder writes
for a set of KV event batches, in the map form (current vLLM) and the array
form (vLLM <= 0.23), with integer and raw-bytes block hashes.

The Go test (events/golden_vllm_test.go) rebuilds each case from its
description, encodes it with events.Format and compares the bytes. Only the
bytes are committed; the vLLM code that produced them is not.

Usage (from the repository root, with the test suite's .venv):

    .venv/bin/pip download --no-deps -d /tmp/vllm023 vllm==0.23.0
    .venv/bin/python events/testdata/gen_vllm_golden.py /tmp/vllm023/vllm-0.23.0-*.whl

The map form comes from the vllm installed in the running interpreter, the
array form from vllm/distributed/kv_events.py inside the given 0.23.0
wheel, loaded on top of the installed package (it only imports modules that
still exist).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import sys
import tempfile
import zipfile
from pathlib import Path

CASES = [
    {
        "name": "placeholder stored on CPU (spec example)",
        "ts": 1789095808.83,
        "dp_rank": 0,
        "events": [
            {"type": "BlockStored", "block_hashes": ["1111111111111111111111111111111111111111111111" "11dab89baa7b5857c0"],
             "parent_block_hash": None, "token_ids": [], "block_size": 0, "lora_id": None,
             "medium": "CPU", "lora_name": None, "group_idx": 0},
        ],
    },
    {
        "name": "self-describing stored on local STORAGE",
        "ts": 1700000000.5,
        "dp_rank": 3,
        "events": [
            {"type": "BlockStored", "block_hashes": ["00000000000003e8", "00000000000003e9"],
             "parent_block_hash": "00000000000003e7", "token_ids": [1, 2, 3, 4, 70000, 6, 7, 8],
             "block_size": 4, "lora_id": 7, "medium": "STORAGE", "lora_name": "adapter-ä",
             "group_idx": 1, "kv_cache_spec_kind": "full_attention", "locality": "LOCAL"},
        ],
    },
    {
        "name": "MLA stored and removed, remote CPU tier",
        "ts": 1.0,
        "dp_rank": 0,
        "events": [
            {"type": "BlockStored", "block_hashes": ["ffffffffffffffff"], "parent_block_hash": None,
             "token_ids": [5, 6], "block_size": 2, "lora_id": None, "medium": "CPU", "lora_name": None,
             "group_idx": 0, "kv_cache_spec_kind": "mla_attention", "locality": "REMOTE"},
            {"type": "BlockRemoved", "block_hashes": ["ffffffffffffffff"], "medium": "CPU",
             "group_idx": 0, "locality": "REMOTE"},
        ],
    },
    {
        "name": "removals by group and a clear",
        "ts": 1073741824.0,
        "dp_rank": 7,
        "events": [
            {"type": "BlockRemoved", "block_hashes": ["0000000000000001", "00000000000000ff"],
             "medium": "STORAGE", "group_idx": 2, "locality": "LOCAL"},
            {"type": "BlockRemoved", "block_hashes": ["000000000000ffff"], "medium": None},
            {"type": "AllBlocksCleared"},
        ],
    },
    {
        "name": "sliding window placeholder",
        "ts": 1234.25,
        "dp_rank": 1,
        "events": [
            {"type": "BlockStored", "block_hashes": ["0102030405060708090a"], "parent_block_hash": None,
             "token_ids": [], "block_size": 0, "lora_id": None, "medium": "CPU", "lora_name": None,
             "group_idx": 4, "kv_cache_spec_kind": "sliding_window", "kv_cache_spec_sliding_window": 4096},
        ],
    },
    {
        "name": "a tenant's request: the salt on its first block only, as vLLM writes a cache_salt",
        "ts": 99.5,
        "dp_rank": 0,
        "events": [
            {"type": "BlockStored", "block_hashes": ["00000000000003e8", "00000000000003e9"],
             "parent_block_hash": None, "token_ids": list(range(100, 132)), "block_size": 16, "lora_id": None,
             "medium": "CPU", "lora_name": None, "extra_keys": [("kvtier_tenant:acme",), None],
             "group_idx": 0, "kv_cache_spec_kind": "full_attention", "locality": "LOCAL"},
            {"type": "BlockStored", "block_hashes": ["00000000000003ea"],
             "parent_block_hash": "00000000000003e9", "token_ids": list(range(132, 148)), "block_size": 16,
             "lora_id": None, "medium": "CPU", "lora_name": None, "group_idx": 0,
             "kv_cache_spec_kind": "full_attention", "locality": "LOCAL"},
            {"type": "BlockStored", "block_hashes": ["00000000000007d0"],
             "parent_block_hash": None, "token_ids": list(range(16)), "block_size": 16, "lora_id": None,
             "medium": "STORAGE", "lora_name": None, "extra_keys": [("a salt the router knows",)],
             "group_idx": 0, "kv_cache_spec_kind": "full_attention", "locality": "LOCAL"},
        ],
    },
]

ARRAY_FIELDS = {  # the fields vLLM 0.23's structs have
    "BlockStored": {"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
                    "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window"},
    "BlockRemoved": {"block_hashes", "medium", "group_idx"},
    "AllBlocksCleared": set(),
}


def wire_hash(h: str, raw: bool):
    b = bytes.fromhex(h)
    return b if raw else int.from_bytes(b, "big") & ((1 << 64) - 1)


def build(mod, case: dict, raw: bool, array_era: bool):
    import msgspec  # noqa: F401  (a vllm dependency)

    events = []
    for ev in case["events"]:
        fields = {k: v for k, v in ev.items() if k != "type"}
        if array_era:
            fields = {k: v for k, v in fields.items() if k in ARRAY_FIELDS[ev["type"]]}
        for k in ("block_hashes",):
            if k in fields:
                fields[k] = [wire_hash(h, raw) for h in fields[k]]
        if fields.get("parent_block_hash") is not None:
            fields["parent_block_hash"] = wire_hash(fields["parent_block_hash"], raw)
        events.append(getattr(mod, ev["type"])(**fields))
    return mod.KVEventBatch(ts=case["ts"], events=events, data_parallel_rank=case["dp_rank"])


def load_array_era(wheel: str):
    tmp = Path(tempfile.mkdtemp())
    with zipfile.ZipFile(wheel) as z:
        path = tmp / "kv_events_v023.py"
        path.write_bytes(z.read("vllm/distributed/kv_events.py"))
    spec = importlib.util.spec_from_file_location("kv_events_v023", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    wheel = sys.argv[1]
    import msgspec
    import vllm.distributed.kv_events as current

    old = load_array_era(wheel)
    out = {
        "generated_by": "events/testdata/gen_vllm_golden.py",
        "map_form": "vllm " + importlib.metadata.version("vllm"),
        "array_form": "vllm " + os.path.basename(wheel).split("-")[1],
        "cases": [],
    }
    enc = msgspec.msgpack.Encoder()
    for case in CASES:
        entry = dict(case)
        for raw in (False, True):
            suffix = "raw" if raw else "int"
            entry["map_" + suffix] = enc.encode(build(current, case, raw, False)).hex()
            entry["array_" + suffix] = enc.encode(build(old, case, raw, True)).hex()
        out["cases"].append(entry)
    dst = Path(__file__).with_name("vllm_golden.json")
    dst.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    print("wrote", dst)


if __name__ == "__main__":
    main()
