#!/usr/bin/env bash
# `make demo`: the whole varpack flow end to end on built-in synthetic data.
#   synth (tokenized) -> lengths -> check -> mpiexec -n 2 sort -> plan -> inspect (+plot) -> validate
#   -> torchrun: a tiny GPT trained for 12 steps on 2 processes, replaying the plan. The tokens
#   count up from a random id in each sample (synth --pattern count), which the model learns:
#   its loss falls from ln(512) = 6.2 to about 4 (random tokens would keep it at 6.2).
set -euo pipefail
OUT=${1:-demo-out}
rm -rf "$OUT"
mkdir -p "$OUT"
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "1. synthetic tokenized dataset (long-tail chat lengths, 4 unequal shards; learnable tokens)"
varpack synth "$OUT/tokens" --dist long-tail --num-samples 4000 --max-len 2048 --shards 4 \
  --tokenized --pattern count --vocab-size 512 --seed 7

step "2. derive the length metadata from the tokens (+ the memory-mappable token copy, same pass)"
varpack lengths "$OUT/tokens" "$OUT/meta" --id-column sample_id --arrow-copy "$OUT/tokens.arrow"

step "3. validate and summarise the metadata"
varpack check "$OUT/meta"

step "4. distributed sample sort on 2 MPI ranks"
mpiexec -n 2 python -m mpi4py -m varpack sort "$OUT/meta" "$OUT/sorted"

step "5. plan: 2 data-parallel ranks, grad-accum 2, packed, 4K-token budget, shuffled window, sqrt LR, 8 shapes + compile warm-up"
varpack plan "$OUT/sorted" "$OUT/plan" --dp 2 --grad-accum 2 --max-tokens 4096 --layout packed \
  --pad-multiple 64 --order shuffle --seed 1 --shuffle-window 8 --cost flops --model-preset qwen2.5-0.5b \
  --lr-scaling sqrt --base-batch-size 64 --max-shapes 8 --warmup reorder

step "6. inspect (figures + plot)"
varpack inspect "$OUT/plan" --plot "$OUT/plan.png"

step "7. validate the plan against its metadata"
varpack validate "$OUT/plan" --metadata "$OUT/meta"

step "8. train: replay the plan on 2 processes (torchrun, DDP over gloo); the loss falls"
OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node 2 jobs/train.py --plan "$OUT/plan" \
  --data "$OUT/tokens.arrow" --out "$OUT/run" --preset tiny --vocab-size 512 --max-steps 12 \
  --lr 1e-2 --warmup-steps 2 --log-every 2

echo
echo "demo outputs in $OUT/ (plan.png is the plot, run/ the training checkpoint)"
