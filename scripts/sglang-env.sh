#!/usr/bin/env bash
# sglang-env.sh DIR BASE: creates (or reuses) a virtual environment at DIR
# with SGLang, layered over the vLLM environment BASE (.venv), for
# kvtier.sglang's tests (python/tests/test_sglang.py) and benchmark
# (python/bench/sglang_l3.py).
#
# Why layered, and why SGLang without its dependencies: SGLang's wheel pins
# CUDA-only kernels (sglang-kernel, flashinfer, flash-attn-4, deep-ep, ...)
# and torch 2.14.1 with its CUDA libraries, several GB that a machine
# without a GPU cannot use. What kvtier.sglang touches — HiCacheStorage and
# its factory, the host KV pools, HiCacheController — runs on CPU with
# BASE's torch (2.14.0) and the two packages below, which BASE lacks.
set -euo pipefail
SGLANG=${SGLANG:-sglang==0.5.23}
dir=${1:?usage: sglang-env.sh DIR BASE}
base=${2:?usage: sglang-env.sh DIR BASE}
"$(dirname "$0")/layered-venv.sh" "$dir" "$base" "$SGLANG" -- --no-deps "$SGLANG" -- gguf==0.19.0 ipython==9.18.1
"$dir/bin/python" -W ignore -c '
import sglang.srt.mem_cache.hicache_storage, sglang.srt.mem_cache.storage
import sglang.srt.managers.cache_controller, sglang.srt.mem_cache.pool_host.mha
import kvtier.sglang.storage' ||
  { echo "sglang-env.sh: $dir cannot import SGLang's HiCache modules and kvtier.sglang" >&2; exit 1; }
echo "sglang ${SGLANG#sglang==} over $base"
