#!/usr/bin/env bash
# The three GPU benchmarks in one call, within a total time budget (default 540 s, for a 10-minute
# slot), each writing its table (.md) and figures (.json) to OUT:
#
#   tests/benchmarks/run_gpu.sh OUT [TOTAL_SECONDS]
#
# 1. bench_calibrate_gpu.py -> OUT/calib.{csv,json,md}, OUT/calib-fits.json (the time model);
# 2. bench_gpu_ranks.py --calib OUT/calib.json -> OUT/ranks.{md,json};
# 3. bench_gpu.py --rows $GPU_ROWS -> OUT/gpu.{md,json}: by default the rows whose meaning changed
#    since the measured run (packed varlen with the reader's share, the OOM baseline, the compiled
#    row against the compiled reference); GPU_ROWS=all runs every row (needs about 8 minutes alone).
# Each bench gets a share of what is left and stops starting rows at it; `timeout` is the backstop.
# Logs: OUT/*.log. Without CUDA every bench says so and exits 0. BENCH_ARGS go to all three,
# GPU_ARGS to bench_gpu.py only; a CPU smoke run of this script:
#   BENCH_ARGS="--quick --device cpu --dtype fp32" GPU_ARGS="--compile-backend eager" \
#     tests/benchmarks/run_gpu.sh /tmp/gpu-smoke 300
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:?usage: run_gpu.sh OUT [TOTAL_SECONDS]}
total=${2:-540}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
start=$SECONDS
left() { echo $((total - (SECONDS - start))); }

run() {  # run NAME BUDGET GRACE ARGS...: the bench with --time-budget BUDGET, killed at BUDGET+GRACE
  local name=$1 budget=$2 grace=$3
  shift 3
  if [ "$budget" -le 0 ]; then
    echo "=== $name: no time left; skipped" | tee "$out/$name.log"
    return 0
  fi
  echo "=== $name (time budget ${budget}s)"
  timeout --signal=INT --kill-after=10 $((budget + grace)) \
    python "tests/benchmarks/$name.py" --time-budget "$budget" ${BENCH_ARGS:-} "$@" 2>&1 |
    tee "$out/$name.log"
  echo "=== $name: exit ${PIPESTATUS[0]} after $((SECONDS - start))s in all"
}

run bench_calibrate_gpu $(( $(left) * 12 / 100 )) 60 --out "$out/calib"
calib=()
[ -f "$out/calib.json" ] && calib=(--calib "$out/calib.json")
run bench_gpu_ranks $(( $(left) * 40 / 100 )) 60 "${calib[@]}" --out "$out/ranks"
rows=${GPU_ROWS:-2,6,10}
[ "$rows" = "all" ] && rows=1,2,3,4,5,6,7,8,9,10
# bench_gpu's budget counts from its start; a row started just before it may take 2 minutes more
run bench_gpu $(( $(left) - 120 )) 110 ${GPU_ARGS:-} --rows "$rows" --out "$out/gpu"
echo "=== all done in $((SECONDS - start))s: $(ls "$out" | tr '\n' ' ')"
