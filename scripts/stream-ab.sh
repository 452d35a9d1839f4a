#!/usr/bin/env bash
# Cold block-stream gets of two daemon builds side by side (issue 48):
# builds the daemon at REV (default 3891678, the tree before the stream's
# known-checksum change) and at this tree, starts both on loopback with a
# 1.5 GiB memfd primary and no secondary tier, and runs
# BenchmarkStreamColdAB (server/stream_cold_bench_test.go) against them,
# REV as A and this tree as B, one benchmark run per round:
#
#   ./scripts/stream-ab.sh                 3891678 against this tree, 8 rounds
#   ./scripts/stream-ab.sh a26aa37 12      another build, 12 rounds
#
# B/A-med above 1: this tree's gets are faster. Nothing is left behind.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
rev=${1:-3891678}
rounds=${2:-8}
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  git -C "$root" worktree remove --force "$work/old" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
cd "$root"
git worktree add --detach "$work/old" "$rev" >/dev/null
(cd "$work/old" && go build -o "$work/kvtier-a" ./cmd/kvtier)
go build -o "$work/kvtier-b" ./cmd/kvtier
go test -c -o "$work/server.test" ./server/
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
addrs=()
for side in a b; do
  port=$(free_port)
  cat >"$work/$side.yaml" <<YAML
namespace: {model: stream-ab, bytes_per_block: 2MiB}
primary: {bytes: 1536MiB, policy: lru, arena: {kind: memfd}}
secondary_tiers: []
server: {unix_socket: "", tcp_addr: "127.0.0.1:$port", metrics_addr: ""}
YAML
  "$work/kvtier-$side" serve --config "$work/$side.yaml" >"$work/$side.log" 2>&1 &
  pids+=($!)
  addrs+=("127.0.0.1:$port")
done
for a in "${addrs[@]}"; do
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/${a%:*}/${a#*:}") 2>/dev/null && break
    sleep 0.1
  done
done
echo "A = $rev ($(git rev-parse --short "$rev")), B = this tree ($(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo ', modified')); load: $(cut -d' ' -f1-3 /proc/loadavg)"
KVTIER_STREAM_AB="${addrs[0]},${addrs[1]}" "$work/server.test" -test.run '^$' \
  -test.bench '^BenchmarkStreamColdAB$' -test.benchtime 160x -test.count "$rounds"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
