#!/usr/bin/env bash
# The base pair on every set for evaluate.seed SEED + 1 (shared by the arms' seed SEED): base/seedSEED/.
set -euo pipefail
seed=$1
repo=$(cd "$(dirname "$0")/../../.." && pwd)
here=$repo/reports/experiments/skill_not_template
source "$repo/.venv/bin/activate"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
cd "$repo"
python "$here/eval_sets.py" "$repo" "$here/base/seed$seed" --pair base --seed $((seed + 1)) 2>&1 | grep -v Warning
