#!/usr/bin/env bash
# The 3-seed warm-start experiment: train_magrpo.warm_start_epochs 4 (warm_start_lr 5e-4) then 24 MAGRPO updates at
# learning_rate 3e-4. As run: one clone of the repository per seed, params.yaml edited as below, the stages run
# directly (python stages/train_magrpo.py, python stages/evaluate.py) with OMP_NUM_THREADS=1, three at a time on
# 2 cores, baselines copied from one run (same stage and params). The same as DVC experiments from one workspace:
set -euo pipefail
source .venv/bin/activate
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false MLFLOW_ENABLE_ASYNC_LOGGING=false OMP_NUM_THREADS=1
out=reports/experiments/warm_start
mbpp=reports/experiments/learnable_default_v3/external/mbpp_easy.jsonl
for s in 0 1 2; do
  dvc exp run -n "ws-seed$s" -S train_magrpo.warm_start_epochs=4 -S train_magrpo.warm_start_lr=0.0005 \
    -S train_magrpo.learning_rate=0.0003 -S train_magrpo.seed=$s -S evaluate.seed=$((s + 1))
  mkdir -p "$out/seed$s"
  cp reports/eval/base.jsonl reports/eval/magrpo.jsonl reports/metrics.json reports/train/magrpo.json \
     reports/train/magrpo_steps.csv reports/train/magrpo_samples.jsonl params.yaml "$out/seed$s/"
  cp reports/eval/transfer/humaneval_base.jsonl reports/eval/transfer/humaneval_magrpo.jsonl "$out/seed$s/"
  # the pair after the warm start alone (no MAGRPO update), same sampling seed: what the RL phase adds
  orchestry evaluate --problems data/problems/test.jsonl --adapters models/adapters/magrpo/warm_start \
    --num-samples 2 --samples "$out/seed$s/warm_start" --out "$out/seed$s/warm_start.json" -q
  # easy problems written by someone else (40 MBPP problems, HumanEval format)
  orchestry evaluate --problems "$mbpp" --adapters models/adapters/magrpo --num-samples 2 \
    --samples "$out/seed$s/external" --out "$out/seed$s/external.json" -q
done
python "$out/summarize.py" "$out"/seed{0,1,2}
