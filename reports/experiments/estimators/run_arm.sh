#!/usr/bin/env bash
# One estimator arm x one seed: train_magrpo from the seed's shared warm start (train_magrpo.init_adapters), in a
# scratch copy of this checkout's code, then the trained pair on the test split and the external sets.
#   run_arm.sh ARM SEED WARM_START_DIR [train_magrpo.KEY=VALUE ...]   (train_magrpo.seed = SEED, evaluate.seed = SEED + 1)
# WARM_START_DIR: models/adapters/magrpo/warm_start of a default run with train_magrpo.seed = SEED.
# PROBLEMS=DIR: the train/val/test problems (default: the checkout's data/problems, which must be the current
# `prepare` output: 96 train problems with the default params; the count and digest go to OUT/problems.txt).
# STEPS=N overrides num_steps (a probe); SETS="test easy40 ..." the evaluated sets (none: no evaluation).
set -euo pipefail
arm=$1; seed=$2; warm=$3; shift 3
repo=$(cd "$(dirname "$0")/../../.." && pwd)
here=$repo/reports/experiments/estimators
work=${WORK_ROOT:-/tmp/estimators}/$arm-s$seed
out=$here/$arm/seed$seed
rm -rf "$work"; mkdir -p "$work/data" "$work/models" "$out"
cp -r "$repo/src" "$repo/stages" "$repo/params.yaml" "$repo/dvc.yaml" "$work/"
problems=${PROBLEMS:-$repo/data/problems}
cp -r "$problems" "$work/data/problems"
echo "$(wc -l < "$problems/train.jsonl") train problems, train.jsonl md5 $(md5sum < "$problems/train.jsonl" | cut -c1-12)" \
  > "$out/problems.txt"
ln -s "$repo/models/base" "$work/models/base"
source "$repo/.venv/bin/activate"
export PYTHONPATH=$work/src OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export TOKENIZERS_PARALLELISM=false MLFLOW_ENABLE_ASYNC_LOGGING=false ORCHESTRY_PROGRESS=0
python "$repo/reports/experiments/set_params.py" "$work/params.yaml" train_magrpo.seed=$seed \
  evaluate.seed=$((seed + 1)) "train_magrpo.init_adapters=$warm" ${STEPS:+train_magrpo.num_steps=$STEPS} "$@"
cp "$work/params.yaml" "$out/params.yaml"
cd "$work"
t0=$(date +%s)
python stages/train_magrpo.py > "$out/train.log" 2>&1
t1=$(date +%s)
cp reports/train/magrpo.json reports/train/magrpo_steps.csv "$out/"
if [ "${SETS:-}" != "none" ]; then
  python "$repo/reports/experiments/skill_not_template/eval_sets.py" "$work" "$out/trained" --pair magrpo \
    --seed $((seed + 1)) --sets ${SETS:-test easy40 mbpp_easy others_a} > "$out/eval.log" 2>&1
fi
t2=$(date +%s)
echo "{\"train_s\": $((t1 - t0)), \"eval_s\": $((t2 - t1))}" > "$out/times.json"
grep -v Warning "$out/eval.log" 2>/dev/null | tail -5 || true
