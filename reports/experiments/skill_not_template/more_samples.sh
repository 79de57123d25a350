#!/usr/bin/env bash
# Two more samples per problem for pass@4: the base pair and seed SEED's trained pair on the test split and the three
# reported external sets, evaluate seed SEED + 101 (the first two samples used SEED + 1), into base/seedSEED/more/ and
# B/seedSEED/trained_more/. summarize.py pools them with the first two: 4 samples per problem and seed.
#   more_samples.sh SEED WORKDIR ADAPTERS   (WORKDIR: the seed's params.yaml and data/problems; ADAPTERS: its pair)
set -euo pipefail
seed=$1; work=$2; adapters=$3
repo=$(cd "$(dirname "$0")/../../.." && pwd)
here=$repo/reports/experiments/skill_not_template
source "$repo/.venv/bin/activate"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# a set whose file is there is not evaluated again (a queue killed half-way resumes)
todo() { for s in test easy40 mbpp_easy others_a; do [ -s "$1/$s.jsonl" ] || echo "$s"; done; }
sets=$(todo "$here/base/seed$seed/more")
if [ -n "$sets" ]; then
  python "$here/eval_sets.py" "$work" "$here/base/seed$seed/more" --pair base --seed $((seed + 101)) --sets $sets
fi
sets=$(todo "$here/B/seed$seed/trained_more")
if [ -n "$sets" ]; then
  python "$here/eval_sets.py" "$work" "$here/B/seed$seed/trained_more" --pair magrpo --adapters "$adapters" \
    --seed $((seed + 101)) --sets $sets
fi
