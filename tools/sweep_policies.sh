#!/usr/bin/env bash
# Sparsity sweep of every policy (the issue-4 findings): for each sparsity, one `kvlens-cli eval`
# process runs all policies in lockstep on the co-reference benchmark and on a perplexity text;
# the processes run in parallel (one thread each) and their CSV lines are merged per task.
# usage: tools/sweep_policies.sh CLI MODEL_DIR PPL_TEXT OUT_DIR [SAMPLES] [PPL_TOKENS] [JOBS]
#   e.g. tools/sweep_policies.sh build/app/kvlens-cli assets/models/demo \
#          ../shared/data/eval/wikitext2-test.txt out/sweep 200 16384 16
set -euo pipefail
cli=${1:?usage: sweep_policies.sh CLI MODEL_DIR PPL_TEXT OUT_DIR [SAMPLES] [PPL_TOKENS] [JOBS]}
model=${2:?model dir}
text=${3:?perplexity text file}
out=${4:?output dir}
samples=${5:-200}
ppl_tokens=${6:-16384}
jobs=${7:-$(nproc)}
policies=${KVLENS_SWEEP_POLICIES:-dense,oracle,streaming,h2o,snapkv,quest,keydiff,tokenfilter,lazyllm,random}
sparsities=${KVLENS_SWEEP_SPARSITIES:-0.1 0.2 0.3 0.4 0.5 0.6 0.7 0.8 0.9}
mkdir -p "$out"

run_one() {  # task sparsity
  local task=$1 s=$2 extra=()
  if [ "$task" = coref ]; then extra=(--samples "$samples"); else extra=(--text-file "$text" --max-tokens "$ppl_tokens"); fi
  "$cli" eval --model "$model" --task "$task" --policies "$policies" --sparsity "$s" --threads 1 \
    "${extra[@]}" --json "$out/$task-$s.json" --csv "$out/$task-$s.csv" >"$out/$task-$s.txt" 2>&1
}
export -f run_one
export cli model text out samples ppl_tokens policies
for task in coref ppl; do for s in $sparsities; do echo "$task $s"; done; done |
  xargs -P "$jobs" -L 1 bash -c 'run_one "$0" "$1" || { echo "failed: $0 $1" >&2; cat "$out/$0-$1.txt" >&2; exit 255; }'

for task in coref ppl; do
  first=1
  for s in $sparsities; do
    if [ $first = 1 ]; then head -n 1 "$out/$task-$s.csv"; first=0; fi
    # dense appears once per file; keep it from the first file only
    tail -n +2 "$out/$task-$s.csv" | { if [ "$s" != "${sparsities%% *}" ]; then grep -v '^dense,'; else cat; fi; }
  done >"$out/$task-sweep.csv"
  echo "== $task sweep: $out/$task-sweep.csv"
  if command -v column >/dev/null; then column -s, -t "$out/$task-sweep.csv"; else cat "$out/$task-sweep.csv"; fi
done
