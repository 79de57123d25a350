#!/usr/bin/env bash
# Arms A and F on two problem sets written by others: ./run_external.sh WORKTREE OUT [SEED0_ADAPTERS]
# WORKTREE: the arm's checkout prepared as for run_seed.sh (its params.yaml the arm's). For seeds 0-2: sets
# train_magrpo.seed S and evaluate.seed S+1, trains the MAGRPO stage again (train_magrpo is deterministic on one
# machine: each seed's magrpo.json came out equal to run_seed.sh's but for seconds) unless SEED0_ADAPTERS is given for
# seed 0 (as run: A's seed 0 = the committed default run's models/adapters/magrpo; F's seed 0 = the adapters run_seed.sh
# had just left in the worktree), then evaluates the trained pair and the base pair (adapters off, same sampling seed)
# on ../easy_external/easy40.jsonl and ../learnable_default_v3/external/mbpp_easy.jsonl, 2 samples each, into
# OUT/seedS/{easy40,external}. Nothing else may run meanwhile (one torch process at a time).
set -euo pipefail
wt=$1; out=$2; seed0_adapters=${3:-}
root=$(cd "$(dirname "$0")/../../.." && pwd)
easy=$root/reports/experiments/easy_external/easy40.jsonl
mbpp=$root/reports/experiments/learnable_default_v3/external/mbpp_easy.jsonl
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false MLFLOW_ENABLE_ASYNC_LOGGING=false \
  ORCHESTRY_PROGRESS=0 PYTHONPATH="$wt/src"
cd "$wt"
for s in 0 1 2; do
  python "$root/reports/experiments/warm_start_packing/set_seeds.py" "$s"
  d=$out/seed$s; mkdir -p "$d"
  adapters=$wt/models/adapters/magrpo
  if [ "$s" = 0 ] && [ -n "$seed0_adapters" ]; then
    adapters=$seed0_adapters
  else
    rm -rf .orchestry/checkpoints
    python stages/train_magrpo.py
  fi
  orchestry evaluate --problems "$easy" --adapters "$adapters" --num-samples 2 --samples "$d/easy40" \
    --out "$d/easy40.json" -q
  orchestry evaluate --problems "$mbpp" --adapters "$adapters" --num-samples 2 --samples "$d/external" \
    --out "$d/external.json" -q
done
