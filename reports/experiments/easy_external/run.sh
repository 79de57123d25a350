#!/usr/bin/env bash
# This experiment's runs, from the repository root. As run: one clone per seed (params.yaml: train_magrpo.seed S,
# evaluate.seed S+1), `python stages/train_magrpo.py` and `python stages/evaluate.py` with OMP_NUM_THREADS=1 two or
# three at a time; seed 0 of the delegate arm is the default `dvc repro` itself. The same as DVC experiments:
set -euo pipefail
source .venv/bin/activate
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false MLFLOW_ENABLE_ASYNC_LOGGING=false
out=reports/experiments/easy_external
easy=$out/easy40.jsonl
mbpp=reports/experiments/learnable_default_v3/external/mbpp_easy.jsonl
for targets in reference delegate; do
  for s in 0 1 2; do
    dvc exp run -n "easy-$targets-$s" -S train_magrpo.warm_start_plain_targets=$targets \
      -S train_magrpo.seed=$s -S evaluate.seed=$((s + 1))
    if [ "$targets" = reference ]; then d=$out/reference_targets/seed$s; else d=$out/seed$s; fi
    mkdir -p "$d"
    orchestry evaluate --problems "$easy" --adapters models/adapters/magrpo --num-samples 2 \
      --samples "$d/easy40" --out "$d/easy40.json" -q
    if [ "$targets" = reference ]; then
      orchestry evaluate --problems "$easy" --adapters models/adapters/magrpo/warm_start --num-samples 2 \
        --samples "$d/warm_start/easy40" --out "$d/warm_start/easy40.json" -q
    else
      cp reports/eval/base.jsonl reports/eval/magrpo.jsonl reports/metrics.json "$d/"
      cp reports/eval/transfer/humaneval_base.jsonl reports/eval/transfer/humaneval_magrpo.jsonl "$d/"
      orchestry evaluate --problems "$mbpp" --adapters models/adapters/magrpo --num-samples 2 \
        --samples "$d/external" --out "$d/external.json" -q
    fi
    cp reports/train/magrpo.json reports/train/magrpo_steps.csv params.yaml "$d/"
  done
done
python $out/summarize.py $out/seed{0,1,2}
python $out/summarize.py $out/seed{0,1,2} --set external   # MBPP
python $out/summarize.py $out/reference_targets/seed{0,1,2}
python $out/summarize.py $out/reference_targets/seed{0,1,2}/warm_start
python reports/experiments/warm_start/summarize.py $out/seed{0,1,2}
