#!/usr/bin/env bash
# The 3-seed experiment of learnable_default_v3: lr 3e-4 and dynamic_sampling resample (DAPO-style: a group whose
# G joint rewards are all equal is sampled again, up to max_resample = 2 extra groups a step, and left out of the
# loss if still flat). As run: three clones of the repository at the commit that added this folder's first file,
# each `dvc repro` of train_magrpo then evaluate with OMP_NUM_THREADS=1 (two or three at a time on 2 cores), with
# params.yaml's train_magrpo.learning_rate 0.0003, train_magrpo.dynamic_sampling resample, train_magrpo.seed s,
# evaluate.seed s + 1. The same as DVC experiments from one workspace:
set -euo pipefail
source .venv/bin/activate
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false MLFLOW_ENABLE_ASYNC_LOGGING=false OMP_NUM_THREADS=1
out=reports/experiments/learnable_default_v3
for s in 0 1 2; do
  dvc exp run -n "ld3-seed$s" -S train_magrpo.learning_rate=0.0003 -S train_magrpo.dynamic_sampling=resample \
    -S train_magrpo.seed=$s -S evaluate.seed=$((s + 1))
  mkdir -p "$out/seed$s"
  cp reports/eval/base.jsonl reports/eval/magrpo.jsonl reports/metrics.json reports/train/magrpo.json \
     reports/train/magrpo_steps.csv reports/train/magrpo_samples.jsonl params.yaml "$out/seed$s/"
  cp reports/eval/transfer/humaneval_base.jsonl reports/eval/transfer/humaneval_magrpo.jsonl "$out/seed$s/"
  # easy problems written by someone else (MBPP, HumanEval format; see README): EXTERNAL=path/to/mbpp_easy.jsonl
  if [ -n "${EXTERNAL:-}" ]; then
    orchestry evaluate --problems "$EXTERNAL" --adapters models/adapters/magrpo --num-samples 2 \
      --samples "$out/seed$s/external" --out "$out/seed$s/external.json" -q
  fi
done
for who in base magrpo humaneval_base humaneval_magrpo; do cat "$out"/seed{0,1,2}/$who.jsonl > "$out/pooled_$who.jsonl"; done
orchestry paired "$out/pooled_base.jsonl" "$out/pooled_magrpo.jsonl"                        # generated test split
orchestry paired "$out/pooled_humaneval_base.jsonl" "$out/pooled_humaneval_magrpo.jsonl"    # HumanEval transfer
python reports/experiments/learnable_default_v2/summarize.py "$out"/seed{0,1,2}                                           # per seed and over seeds
