#!/usr/bin/env bash
# `make bench`: every benchmark in one run, each printing its table and ratios against its baseline.
# QUICK=1 make bench  -> small sizes (a smoke run of a few minutes).
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p bench-out
args=()
[ "${QUICK:-0}" = "1" ] && args+=(--quick)
for bench in tests/benchmarks/bench_*.py; do
  echo "=== $bench ${args[*]:-}"
  python "$bench" "${args[@]}" 2>&1 | tee "bench-out/$(basename "$bench" .py).txt"
done
