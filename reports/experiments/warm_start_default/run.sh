#!/usr/bin/env bash
# This experiment's runs, from the repository root. As run: one clone per seed (params.yaml edited: train_magrpo.seed
# S, evaluate.seed S+1), stages run directly with OMP_NUM_THREADS=1, two or three jobs at a time on 2 cores; seed 0 is
# the default `dvc repro` itself. The same as DVC experiments from one workspace:
set -euo pipefail
source .venv/bin/activate
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false MLFLOW_ENABLE_ASYNC_LOGGING=false OMP_NUM_THREADS=1
out=reports/experiments/warm_start_default
mbpp=reports/experiments/learnable_default_v3/external/mbpp_easy.jsonl
for s in 0 1 2; do
  # arm "lr 3e-4" (the default until this experiment): warm start (auto: 2 epochs of both prompt forms), 24 updates
  dvc exp run -n "wsd-seed$s" -S train_magrpo.learning_rate=0.0003 -S train_magrpo.seed=$s -S evaluate.seed=$((s + 1))
  mkdir -p "$out/seed$s"
  cp reports/eval/base.jsonl reports/eval/magrpo.jsonl reports/metrics.json reports/train/magrpo.json \
     reports/train/magrpo_steps.csv reports/train/magrpo_samples.jsonl params.yaml "$out/seed$s/"
  cp reports/eval/transfer/humaneval_base.jsonl reports/eval/transfer/humaneval_magrpo.jsonl "$out/seed$s/"
  # the warm-started pair alone (no MAGRPO update), same sampling seed
  orchestry evaluate --problems data/problems/test.jsonl --adapters models/adapters/magrpo/warm_start \
    --num-samples 2 --samples "$out/seed$s/warm_start" --out "$out/seed$s/warm_start.json" -q
  if [ "$s" != 2 ]; then  # seed 2's MBPP evaluation of this arm was not run
    orchestry evaluate --problems "$mbpp" --adapters models/adapters/magrpo --num-samples 2 \
      --samples "$out/seed$s/external" --out "$out/seed$s/external.json" -q
  fi
  # arm "lr 1e-4" (the default now): the 24 updates again from the same warm-started pair
  rm -rf "/tmp/lr1e-4_s$s"; mkdir -p "$out/seed$s/lr1e-4"
  python "$out/magrpo_from_warm_start.py" models/adapters/magrpo/warm_start 0.0001 "/tmp/lr1e-4_s$s" "$s"
  orchestry evaluate --problems data/problems/test.jsonl --adapters "/tmp/lr1e-4_s$s/adapters" \
    --num-samples 2 --samples "$out/seed$s/lr1e-4" --out "$out/seed$s/lr1e-4.json" -q
  orchestry evaluate --problems "$mbpp" --adapters "/tmp/lr1e-4_s$s/adapters" --num-samples 2 \
    --samples "$out/seed$s/lr1e-4/external" --out "$out/seed$s/lr1e-4/external.json" -q
done
python reports/experiments/warm_start/summarize.py "$out"/seed{0,1,2}
