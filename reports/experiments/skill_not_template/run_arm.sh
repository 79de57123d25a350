#!/usr/bin/env bash
# One arm x one seed: train_magrpo in a scratch copy of this checkout's code (its own src on PYTHONPATH, so later
# edits of the checkout do not reach a running arm), then the trained pair on every set (eval_sets.py).
#   run_arm.sh ARM SEED [train_magrpo.KEY=VALUE ...]      (train_magrpo.seed = SEED, evaluate.seed = SEED + 1)
# PROBLEMS=DIR takes the train/val/test problems from DIR (an arm with other prepare params: prepare.sh).
# One thread per run (OMP_NUM_THREADS=1), two runs at a time on a 2-core machine; every arm alike.
set -euo pipefail
arm=$1; seed=$2; shift 2
repo=$(cd "$(dirname "$0")/../../.." && pwd)
here=$repo/reports/experiments/skill_not_template
work=${WORK_ROOT:-/tmp/skill_not_template}/$arm-s$seed
out=$here/$arm/seed$seed
rm -rf "$work"; mkdir -p "$work/data" "$work/models" "$out"
cp -r "$repo/src" "$repo/stages" "$repo/params.yaml" "$repo/dvc.yaml" "$work/"
cp -r "${PROBLEMS:-$repo/data/problems}" "$work/data/problems"
ln -s "$repo/models/base" "$work/models/base"
source "$repo/.venv/bin/activate"
export PYTHONPATH=$work/src OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export TOKENIZERS_PARALLELISM=false MLFLOW_ENABLE_ASYNC_LOGGING=false ORCHESTRY_PROGRESS=0
python "$repo/reports/experiments/set_params.py" "$work/params.yaml" \
  train_magrpo.seed=$seed evaluate.seed=$((seed + 1)) "$@"
cp "$work/params.yaml" "$out/params.yaml"
cd "$work"
t0=$(date +%s)
python stages/train_magrpo.py > "$out/train.log" 2>&1
t1=$(date +%s)
cp reports/train/magrpo.json reports/train/magrpo_steps.csv "$out/"
python "$here/eval_sets.py" "$work" "$out/trained" --pair magrpo --seed $((seed + 1)) > "$out/eval.log" 2>&1
t2=$(date +%s)
echo "{\"train_s\": $((t1 - t0)), \"eval_s\": $((t2 - t1))}" > "$out/times.json"
cat "$out/eval.log" | grep -v Warning
