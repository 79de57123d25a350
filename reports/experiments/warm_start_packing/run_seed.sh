#!/usr/bin/env bash
# One seed of one arm: ./run_seed.sh WORKTREE SEED OUT [--eval-only]
# WORKTREE: a checkout of the arm's revision (6e80913: examples shuffled one by one, batches of 8 padded rows;
# 414ca75: whole problems, both prompt forms of a problem in one packed row; arm C: 828b01b, A's code, with
# params.yaml's train_magrpo.warm_start_epochs set to 1; arms D and F: 963a41c, the same code, with warm_start_epochs 1
# and warm_start_batch 4, F also warm_start_lr 0.001), with models/base, data/problems,
# reports/eval_base*, reports/baselines and reports/api_grpo/summary.json taken from a `dvc repro` of the default.
# Runs the MAGRPO stage (warm start + 24 updates) with train_magrpo.seed SEED (not with --eval-only: the adapters
# already trained there), the evaluate_base and evaluate stages with evaluate.seed SEED+1 (as
# ../warm_start_default/), the warm-started pair alone on the test split with the same sampling seed, and copies the
# samples and figures to OUT.
set -euo pipefail
wt=$1; s=$2; out=$3; eval_only=${4:-}
here=$(cd "$(dirname "$0")" && pwd)
cd "$wt"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false MLFLOW_ENABLE_ASYNC_LOGGING=false \
  ORCHESTRY_PROGRESS=0 PYTHONPATH="$wt/src"
python "$here/set_seeds.py" "$s"
if [ "$eval_only" != --eval-only ]; then
  rm -rf .orchestry/checkpoints
  python stages/train_magrpo.py
fi
python stages/evaluate_base.py
python stages/evaluate.py
mkdir -p "$out"
orchestry evaluate --problems data/problems/test.jsonl --adapters models/adapters/magrpo/warm_start \
  --num-samples 2 --samples "$out/warm_start" --out "$out/warm_start.json" -q
cp reports/eval/base.jsonl reports/eval/magrpo.jsonl reports/metrics.json reports/train/magrpo.json \
  reports/train/magrpo_steps.csv params.yaml "$out/"
cp reports/eval/transfer/humaneval_base.jsonl reports/eval/transfer/humaneval_magrpo.jsonl "$out/"
