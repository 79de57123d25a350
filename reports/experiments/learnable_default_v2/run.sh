#!/usr/bin/env bash
# The 3-seed experiment of the generated-problem default after the cut-answer reward change, at learning rate 3e-4.
# As run: three clones of the repository at commit 41b413a (the reward change) plus runtime.py of bb2595c (OMP_NUM_THREADS respected),
# each `dvc repro evaluate` with one torch thread, two at a time on 2 cores:
#   OMP_NUM_THREADS=1 dvc repro evaluate    # with params.yaml's train_magrpo.learning_rate, train_magrpo.seed, evaluate.seed set as below
# The same as DVC experiments from one workspace (the stages each seed re-runs: train_magrpo, train_api_grpo, evaluate):
set -euo pipefail
source .venv/bin/activate
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false MLFLOW_ENABLE_ASYNC_LOGGING=false OMP_NUM_THREADS=1
out=reports/experiments/learnable_default_v2
for s in 0 1 2; do
  dvc exp run -n "ld2-seed$s" -S train_magrpo.learning_rate=0.0003 -S train_magrpo.seed=$s -S evaluate.seed=$((s + 1))
  mkdir -p "$out/seed$s"
  cp reports/eval/base.jsonl reports/eval/magrpo.jsonl reports/metrics.json reports/train/magrpo.json \
     reports/train/magrpo_steps.csv "$out/seed$s/"
  cp reports/eval/transfer/humaneval_base.jsonl reports/eval/transfer/humaneval_magrpo.jsonl "$out/seed$s/"
  # easy problems written by someone else (MBPP-style, not in the repository): any HumanEval-format file
  if [ -n "${EXTERNAL:-}" ]; then
    orchestry evaluate --problems "$EXTERNAL" --num-samples 2 --samples "$out/seed$s/external" --out "$out/seed$s/external.json" -q
  fi
done
for who in base magrpo humaneval_base humaneval_magrpo; do cat "$out"/seed{0,1,2}/$who.jsonl > "$out/pooled_$who.jsonl"; done
orchestry paired "$out/pooled_base.jsonl" "$out/pooled_magrpo.jsonl"                        # generated test split
orchestry paired "$out/pooled_humaneval_base.jsonl" "$out/pooled_humaneval_magrpo.jsonl"    # HumanEval transfer
python "$out/summarize.py" "$out"/seed{0,1,2}                                             # per seed and over seeds
