#!/usr/bin/env bash
# sglang-env.sh DIR BASE: creates (or reuses) a virtual environment at DIR
# with SGLang, layered over the vLLM environment BASE (.venv), for
# kvtier.sglang's tests (python/tests/test_sglang.py) and benchmark
# (python/bench/sglang_l3.py).
#
# Why layered, and why --no-deps: SGLang's wheel pins CUDA-only kernels
# (sglang-kernel, flashinfer, flash-attn-4, deep-ep, ...) and torch 2.14.1
# with its CUDA libraries, several GB that a machine without a GPU cannot
# use. What kvtier.sglang touches — HiCacheStorage and its factory, the
# host KV pools, HiCacheController — runs on CPU with BASE's torch (2.14.0)
# and the few pure-Python packages below. DIR sees BASE's packages through
# a .pth file placed after its own site-packages.
set -euo pipefail
SGLANG=${SGLANG:-sglang==0.5.23}
# The packages the modules above import that BASE lacks.
EXTRA=(gguf==0.19.0 ipython==9.18.1)
dir=${1:?usage: sglang-env.sh DIR BASE}
base=${2:?usage: sglang-env.sh DIR BASE}
py=${KVTIER_VENV_PYTHON:-python3}
base_site=$("$base/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
want=${SGLANG#sglang==}
have=$("$dir/bin/python" -c 'import importlib.metadata as m; print(m.version("sglang"))' 2>/dev/null || true)
if [ "$have" != "$want" ]; then
  rm -rf "$dir"
  "$py" -m venv "$dir"
  site=$("$dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "$base_site" >"$site/zz-base-env.pth"
  for attempt in 1 2 3; do
    "$dir/bin/pip" install -q --retries 10 --timeout 60 --no-deps "$SGLANG" && break
    [ "$attempt" = 3 ] && { echo "sglang-env.sh: cannot install $SGLANG from PyPI (network?)" >&2; exit 1; }
    echo "pip install failed (attempt $attempt of 3); trying again" >&2
  done
  for attempt in 1 2 3; do
    "$dir/bin/pip" install -q --retries 10 --timeout 60 "${EXTRA[@]}" && break
    [ "$attempt" = 3 ] && { echo "sglang-env.sh: cannot install ${EXTRA[*]} from PyPI (network?)" >&2; exit 1; }
    echo "pip install failed (attempt $attempt of 3); trying again" >&2
  done
fi
# kvtier itself: its editable install in BASE is not seen through the .pth.
root=$(cd "$(dirname "$0")/.." && pwd)
"$dir/bin/pip" install -q --no-deps -e "$root/python"
"$dir/bin/python" -c '
import sglang.srt.mem_cache.hicache_storage, sglang.srt.mem_cache.storage
import sglang.srt.managers.cache_controller, sglang.srt.mem_cache.pool_host.mha
import kvtier.sglang.storage' ||
  { echo "sglang-env.sh: $dir cannot import SGLang's HiCache modules and kvtier.sglang" >&2; exit 1; }
echo "sglang $want over $base"
