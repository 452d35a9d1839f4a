#!/usr/bin/env bash
# layered-venv.sh DIR BASE DIST==VERSION -- PIP-ARGS [-- PIP-ARGS ...]:
# creates (or reuses) a virtual environment at DIR that sees the packages
# of the environment BASE, for a third-party package the tests need beside
# vLLM (lmcache-env.sh, sglang-env.sh).
#
# DIR sees BASE's packages through a .pth file placed after its own
# site-packages, so what DIR installs wins where the two differ and BASE is
# left as it is. DIR is rebuilt when its DIST is not VERSION; each PIP-ARGS
# group is one `pip install` (retried: PyPI downloads are large), in order.
# kvtier itself is installed last, editable: BASE's editable install is not
# seen through the .pth.
set -euo pipefail
dir=${1:?usage: layered-venv.sh DIR BASE DIST==VERSION -- PIP-ARGS...}
base=${2:?usage: layered-venv.sh DIR BASE DIST==VERSION -- PIP-ARGS...}
pin=${3:?usage: layered-venv.sh DIR BASE DIST==VERSION -- PIP-ARGS...}
shift 3
[ "${1:-}" = "--" ] || { echo "layered-venv.sh: want -- before the pip arguments" >&2; exit 2; }
dist=${pin%%==*}
want=${pin#*==}
py=${KVTIER_VENV_PYTHON:-python3}
base_site=$("$base/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
have=$("$dir/bin/python" -c "import importlib.metadata as m; print(m.version('$dist'))" 2>/dev/null || true)
if [ "$have" != "$want" ]; then
  rm -rf "$dir"
  "$py" -m venv "$dir"
  site=$("$dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "$base_site" >"$site/zz-base-env.pth"
  "$dir/bin/pip" install -q --upgrade pip
  while [ $# -gt 0 ]; do
    shift # the --
    args=()
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do
      args+=("$1")
      shift
    done
    for attempt in 1 2 3; do
      "$dir/bin/pip" install -q --retries 10 --resume-retries 20 --timeout 60 "${args[@]}" && break
      [ "$attempt" = 3 ] && { echo "layered-venv.sh: cannot install ${args[*]} from PyPI (network?)" >&2; exit 1; }
      echo "pip install failed (attempt $attempt of 3); trying again" >&2
    done
  done
fi
root=$(cd "$(dirname "$0")/.." && pwd)
"$dir/bin/pip" install -q --no-deps -e "$root/python"
