#!/usr/bin/env bash
# build-wheel.sh [OUT_DIR]: builds kvtier's platform wheels, with the
# daemon inside, and the pure-Python sdist, into OUT_DIR (default dist/).
#
#   kvtier-VERSION-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl
#   kvtier-VERSION-py3-none-manylinux_2_17_aarch64.manylinux2014_aarch64.whl
#   kvtier-VERSION.tar.gz     (no daemon: `kvtier` then says so)
#
# The binary is the default build (no build tags) with CGO_ENABLED=0: a
# static executable for each architecture, cross-compiled here. It lacks
# nothing at run time: the libzmq tag adds only tests against libzmq
# itself (KV events go out through kvtier's own ZMTP implementation).
#
# Reproducible: -trimpath, no VCS stamp, no build id, the version from
# python/pyproject.toml, and every archive timestamp SOURCE_DATE_EPOCH
# (default: the last commit's time) — the same tree makes the same files.
# Needs Go 1.26 and Python 3.11 (tomllib).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=$(mkdir -p "${1:-$root/dist}" && cd "${1:-$root/dist}" && pwd)
cd "$root"
version=$(python3 -c 'import tomllib; print(tomllib.load(open("python/pyproject.toml", "rb"))["project"]["version"])')
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 315532800)}
bins=$(mktemp -d)
trap 'rm -rf "$bins"' EXIT
args=()
for arch in amd64 arm64; do
  CGO_ENABLED=0 GOOS=linux GOARCH=$arch go build -trimpath -buildvcs=false \
    -ldflags "-s -w -buildid= -X main.version=$version" -o "$bins/kvtier-$arch" ./cmd/kvtier
  args+=("$arch=$bins/kvtier-$arch")
done
python3 scripts/wheel.py "$out" "${args[@]}"
# The sdist: setuptools' own PEP 517 hook (no `build` package needed).
(cd python && python3 -c '
import sys
from setuptools import build_meta
print(sys.argv[1] + "/" + build_meta.build_sdist(sys.argv[1]))' "$out") 2>/dev/null | tail -1
