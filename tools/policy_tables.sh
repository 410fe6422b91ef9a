#!/usr/bin/env bash
# Every policy at 30/50/70/90% on a model, co-reference (200 samples) and perplexity on a text,
# with the spec's defaults and with the TokenButler code's baseline variants (h2o
# score=current_logit, snapkv protect_window=false, quest max_only=true, budget_excludes_sinks),
# one process per (protocol, sparsity) run in parallel; prints both tables (tools/policy_tables.py).
#   tools/policy_tables.sh CLI MODEL TEXT OUT [THREADS_PER_PROCESS]
# (KVLENS_TABLE_POLICIES=ids overrides the list: every built-in, two composed allocators.)
set -euo pipefail
cli=$1 model=$2 text=$3 out=$4 threads=${5:-2}
policies=${KVLENS_TABLE_POLICIES:-dense,oracle,random,streaming,h2o,snapkv,quest,keydiff,tokenfilter,lazyllm,tokenbutler,tova,pyramidkv,adakv,h2o+adakv,tova+adakv,sparq,loki,doublesparsity,twilight,rocketkv,duoattention,seerattention,magicpig}
tb=(--policy-arg h2o.score=current_logit --policy-arg snapkv.protect_window=false
  --policy-arg quest.max_only=true --policy-arg budget_excludes_sinks=true)
mkdir -p "$out"
for task in coref ppl; do
  if [ "$task" = coref ]; then extra=(--samples 200); else extra=(--text-file "$text"); fi
  for s in 0.3 0.5 0.7 0.9; do
    "$cli" eval --model "$model" --task $task --policies $policies --sparsity $s "${extra[@]}" \
      --threads "$threads" --json "$out/${task}_spec_$s.json" > /dev/null &
    "$cli" eval --model "$model" --task $task --policies $policies --sparsity $s "${extra[@]}" \
      "${tb[@]}" --threads "$threads" --json "$out/${task}_tb_$s.json" > /dev/null &
  done
  wait
done
here=$(dirname "$0")
python3 "$here/policy_tables.py" --coref "$out"/coref_spec_*.json --ppl "$out"/ppl_spec_*.json \
  --title "POLICIES.md defaults"
echo
python3 "$here/policy_tables.py" --coref "$out"/coref_tb_*.json --ppl "$out"/ppl_tb_*.json \
  --title "TokenButler code's baseline variants"
