#!/usr/bin/env bash
# Every policy at 30/50/70/90% on a model, co-reference (200 samples) and perplexity on a text,
# with the spec's defaults and with the TokenButler code's baseline variants (h2o
# score=current_logit, snapkv protect_window=false, quest max_only=true, budget_excludes_sinks),
# one process per (protocol, sparsity) run in parallel; prints both tables (tools/policy_tables.py).
#   tools/policy_tables.sh CLI MODEL TEXT OUT [THREADS_PER_PROCESS]
# Environment: KVLENS_TABLE_POLICIES=ids overrides the list (every built-in, two composed
# allocators); KVLENS_TABLE_SPARSITIES (default 0.3,0.5,0.7,0.9); KVLENS_TABLE_PROTOCOLS (spec,tb);
# KVLENS_TABLE_MATCH=effective compares at matched effective sparsity (`eval --match effective`:
# each sparsity is a target, the files are named *_matched_*, each cell adds the nominal found);
# KVLENS_TABLE_BACKEND (cpu) and KVLENS_TABLE_PYTHON (python3).
set -euo pipefail
[ $# -ge 4 ] || { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
cli=$1 model=$2 text=$3 out=$4 threads=${5:-2}
policies=${KVLENS_TABLE_POLICIES:-dense,oracle,random,streaming,h2o,snapkv,quest,keydiff,tokenfilter,lazyllm,tokenbutler,tova,pyramidkv,adakv,h2o+adakv,tova+adakv,sparq,loki,doublesparsity,twilight,rocketkv,duoattention,seerattention,magicpig}
tb=(--policy-arg h2o.score=current_logit --policy-arg snapkv.protect_window=false
  --policy-arg quest.max_only=true --policy-arg budget_excludes_sinks=true)
sparsities=${KVLENS_TABLE_SPARSITIES:-0.3,0.5,0.7,0.9}
protocols=${KVLENS_TABLE_PROTOCOLS:-spec,tb}
python=${KVLENS_TABLE_PYTHON:-python3}
common=(--threads "$threads" --backend "${KVLENS_TABLE_BACKEND:-cpu}")
mode=nominal
if [ -n "${KVLENS_TABLE_MATCH:-}" ]; then
  common+=(--match "$KVLENS_TABLE_MATCH")
  mode=matched
fi
mkdir -p "$out"
pids=()
for task in coref ppl; do
  if [ "$task" = coref ]; then extra=(--samples 200); else extra=(--text-file "$text"); fi
  for s in ${sparsities//,/ }; do
    for protocol in ${protocols//,/ }; do
      args=()
      [ "$protocol" = tb ] && args=("${tb[@]}")
      file=$out/${task}_${protocol}_${mode}_$s
      "$cli" eval --model "$model" --task $task --policies "$policies" --sparsity "$s" \
        "${extra[@]}" ${args[@]+"${args[@]}"} "${common[@]}" --json "$file.json" \
        >"$file.log" 2>&1 &
      pids+=($!)
    done
  done
done
failed=0
for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
[ "$failed" = 0 ] || { echo "policy_tables.sh: an eval failed (logs in $out)" >&2; exit 1; }
here=$(dirname "$0")
for protocol in ${protocols//,/ }; do
  title="POLICIES.md defaults"
  [ "$protocol" = tb ] && title="TokenButler code's baseline variants"
  [ "$mode" = matched ] && title+=", matched effective sparsity"
  "$python" "$here/policy_tables.py" --coref "$out"/coref_${protocol}_${mode}_*.json \
    --ppl "$out"/ppl_${protocol}_${mode}_*.json --title "$title"
  echo
done
