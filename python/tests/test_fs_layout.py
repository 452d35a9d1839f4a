"""`kvtier fs-layout` names the directory and writes the config.json that
vLLM's own FileMapper (the fs tier's layout) produces for the same fields."""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

import pytest

from vllm.v1.kv_offload.file_mapper import FileMapper

LAYERS = [f"model.layers.{i}.self_attn.attn" for i in range(3)]

CASES: list[dict[str, Any]] = [
    {"model_name": "Qwen/Qwen3-0.6B", "dtype": "bfloat16", "tokens_per_hash": 16, "blocks_per_file": 4,
     "tp_size": 1, "pp_size": 1, "rank": 0, "groups": [(16, LAYERS)], "parallel_agnostic": True},
    {"model_name": "Qwen/Qwen3-0.6B", "dtype": "bfloat16", "tokens_per_hash": 16, "blocks_per_file": 4,
     "tp_size": 4, "pp_size": 2, "rank": 5, "groups": [(16, LAYERS)], "parallel_agnostic": True},
    {"model_name": "deepseek/modèle<&>", "dtype": "fp8_e4m3", "tokens_per_hash": 32, "blocks_per_file": 1,
     "tp_size": 2, "pp_size": 1, "rank": 1, "groups": [(32, LAYERS), (64, ["model.layers.9.attn"])],
     "parallel_agnostic": False},
    {"model_name": "deepseek-ai/DeepSeek-V3", "dtype": "bfloat16", "tokens_per_hash": 64, "blocks_per_file": 2,
     "tp_size": 8, "pp_size": 1, "rank": 3, "groups": [(64, LAYERS)], "parallel_agnostic": True,
     "replicated_layout": True},
    {"model_name": "m", "dtype": "float16", "tokens_per_hash": 16, "blocks_per_file": 1, "tp_size": 1,
     "pp_size": 1, "rank": 0, "groups": [], "parallel_agnostic": True, "canonical_format": "nhd.v1"},
]


def vllm_layout(root: str, c: dict[str, Any]) -> tuple[str, str, str]:
    fm = FileMapper(
        root_dir=root, model_name=c["model_name"], tokens_per_hash=c["tokens_per_hash"],
        blocks_per_file=c["blocks_per_file"], tp_size=c["tp_size"], pp_size=c["pp_size"], pcp_size=1,
        dcp_size=1, rank=c["rank"], dtype=c["dtype"],
        kv_cache_groups=[{"tokens_per_block": t, "layer_names": names} for t, names in c["groups"]],
        parallel_agnostic=c["parallel_agnostic"], replicated_layout=c.get("replicated_layout", False),
        canonical_format=c.get("canonical_format"),
    )
    blocks = fm.get_file_name(b"\x00" * 8 + (0).to_bytes(4, "big")).split("/000/")[0]  # type: ignore[arg-type]
    # vLLM's fs tier writes config.json with json.dump(indent=2, sort_keys=True).
    return fm.base_path, blocks, json.dumps(fm.get_run_config(), indent=2, sort_keys=True)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c['model_name']}-tp{c['tp_size']}-agnostic{c['parallel_agnostic']}")
def test_fs_layout_matches_vllm_file_mapper(kvtier_bin: str, tmp_path: Any, case: dict[str, Any]) -> None:
    root = str(tmp_path)
    args = [kvtier_bin, "fs-layout", "--json", "--root", root, "--model", case["model_name"], "--dtype", case["dtype"],
            "--tokens-per-hash", str(case["tokens_per_hash"]), "--blocks-per-file", str(case["blocks_per_file"]),
            "--tp", str(case["tp_size"]), "--pp", str(case["pp_size"]), "--rank", str(case["rank"]),
            "--parallel-agnostic", "true" if case["parallel_agnostic"] else "false"]
    for tokens, names in case["groups"]:
        args += ["--group", f"{tokens}:{','.join(names)}"]
    if case.get("replicated_layout"):
        args.append("--replicated-layout")
    if case.get("canonical_format"):
        args += ["--canonical-format", case["canonical_format"]]
    got = json.loads(subprocess.run(args, check=True, capture_output=True, text=True).stdout)
    base, blocks, config_json = vllm_layout(root, case)
    assert got["directory"] == base
    assert got["blocks"] == blocks
    assert got["config_json"] == config_json
    assert os.path.basename(base).endswith("_" + got["digest"])
