#!/usr/bin/env bash
# `make bench`: every benchmark in one run, each printing its table and ratios against its baseline.
# QUICK=1 make bench  -> small sizes (a smoke run of a few minutes).
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p bench-out
args=()
[ "${QUICK:-0}" = "1" ] && args+=(--quick)
for bench in tests/benchmarks/bench_*.py; do
  name=$(basename "$bench" .py)
  extra=()
  # the GPU benches write their tables under --out (without CUDA each says so and exits 0)
  case "$name" in *gpu*) extra=(--out "bench-out/$name") ;; esac
  echo "=== $bench ${args[*]:-} ${extra[*]:-}"
  python "$bench" "${args[@]}" "${extra[@]}" 2>&1 | tee "bench-out/$name.txt"
done
