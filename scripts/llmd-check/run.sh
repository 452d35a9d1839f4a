#!/usr/bin/env bash
# Runs harness_test.go: llm-d-kv-cache's own vLLM event adapter, pool,
# token processor and in-memory index, subscribed to a real kvtier daemon
# with two tenants and a shared space (issue 47).
#
# Usage: scripts/llmd-check/run.sh LLMD_CHECKOUT [KVTIER_BIN]
#
# LLMD_CHECKOUT is a checkout of github.com/llm-d/llm-d-kv-cache (its go.mod
# and pkg/ are enough). It is not on the Go module proxy, so it is not part
# of the suite; its own dependencies come from the proxy.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
llmd=$(cd "${1:?usage: run.sh LLMD_CHECKOUT [KVTIER_BIN]}" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [[ -n "${2:-}" ]]; then
  bin=$(realpath "$2")
else
  bin="$work/kvtier"
  (cd "$root" && go build -o "$bin" ./cmd/kvtier)
fi
cp "$here/go.mod" "$here/harness_test.go" "$work/"
cd "$work"
go mod edit -require=github.com/kvtier/kvtier@v0.0.0 -replace=github.com/kvtier/kvtier="$root" \
  -require=github.com/llm-d/llm-d-kv-cache@v0.0.0 -replace=github.com/llm-d/llm-d-kv-cache="$llmd"
# kvtier's module requires k8s.io/api v0.37 (the Helm chart's tests), which
# the build selects for llm-d too: raise the Kubernetes libraries llm-d uses
# to match (its kvevents and kvblock packages build and run unchanged).
go get k8s.io/client-go@v0.37.2 sigs.k8s.io/controller-runtime@v0.25.3 >/dev/null 2>&1
go mod tidy >/dev/null
echo "llm-d-kv-cache: $(git -C "$llmd" rev-parse --short HEAD 2>/dev/null || echo "$llmd"); kvtier: $(git -C "$root" rev-parse --short HEAD)"
KVTIER_BIN="$bin" go test -count=1 -v -run TestTenantsRouteWithLLMD . 2>&1 | tail -40
