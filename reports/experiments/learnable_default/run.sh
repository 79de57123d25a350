#!/usr/bin/env bash
# The 3-seed experiment of the learnable default (generated compositional problems), from a clone of the repository
# whose `dvc repro` has run (seed 0 is the workspace's default run). Seeds 1 and 2 are DVC experiments; each
# re-runs only train_magrpo, evaluate, detect_schemes and plot (the other stages are cached).
set -euo pipefail
source .venv/bin/activate
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false MLFLOW_ENABLE_ASYNC_LOGGING=false
out=reports/experiments/learnable_default
for s in 1 2; do
  dvc exp run -n "ld-seed$s" -S train_magrpo.seed=$s -S evaluate.seed=$((s + 1))
  mkdir -p "$out/seed$s"
  cp reports/eval/base.jsonl reports/eval/magrpo.jsonl reports/metrics.json reports/train/magrpo.json \
     reports/train/magrpo_steps.csv reports/schemes.json "$out/seed$s/"
  cp reports/eval/transfer/humaneval_base.jsonl reports/eval/transfer/humaneval_magrpo.jsonl "$out/seed$s/"
done
# seed 0 is the default run (copy its files to $out/seed0 before running the two experiments), then pool:
for who in base magrpo humaneval_base humaneval_magrpo; do cat "$out"/seed{0,1,2}/$who.jsonl > "$out/pooled_$who.jsonl"; done
orchestry paired "$out/pooled_base.jsonl" "$out/pooled_magrpo.jsonl"                        # generated test split
orchestry paired "$out/pooled_humaneval_base.jsonl" "$out/pooled_humaneval_magrpo.jsonl"    # HumanEval transfer
orchestry seeds                                     # per-seed trained - base and the mean over seeds
