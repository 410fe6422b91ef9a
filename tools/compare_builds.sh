#!/usr/bin/env bash
# Two builds of kvlens-cli on the same inputs, in one job: outputs must be identical, speed is
# compared. For a change that must not alter results (issue 39: the engine reorganised).
#
# usage: tools/compare_builds.sh OLD_CLI NEW_CLI [--backend cpu|cuda] [--model DIR]
#                                [--samples N] [--bench-model DIR] [--context N] [--rounds R]
#   identical: the co-reference table of every built-in policy (eval --json, timings removed),
#              the per-sample results, generate --ids under h2o and quest, score --json under
#              tokenbutler; the demo model unless --model.
#   speed:     bench of the dense step at --context (default 512) on --bench-model (default
#              --model), old and new alternating R rounds (default 5); medians and new / old.
# Prints one line per check (IDENTICAL / DIFFERENT) and the speed table; exits 1 when an output
# differs.
set -euo pipefail

usage() {
  sed -n '5,13p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
  exit 2
}
[ $# -ge 2 ] || usage
old=$1 new=$2
shift 2
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
backend=cpu model=$root/assets/models/demo samples=20 bench_model="" context=512 rounds=5
while [ $# -gt 0 ]; do
  case $1 in
    --backend) backend=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --samples) samples=$2; shift 2 ;;
    --bench-model) bench_model=$2; shift 2 ;;
    --context) context=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    *) usage ;;
  esac
done
bench_model=${bench_model:-$model}
# Both builds read this checkout's bundled files (an old build's own source tree may be gone).
export KVLENS_ASSETS_DIR=${KVLENS_ASSETS_DIR:-$root/assets}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
policies=dense,oracle,random,streaming,h2o,snapkv,quest,keydiff,tokenfilter,lazyllm
[ -f "$model/predictor.safetensors" ] && policies+=,tokenbutler
status=0
printf 'The place is: the old mill by the river. The baker walked past it every morning, and later the place is the old mill.' >"$work/text.txt"

same() {  # same LABEL FILE_OLD FILE_NEW
  if cmp -s "$2" "$3"; then
    echo "IDENTICAL  $1"
  else
    echo "DIFFERENT  $1"
    diff "$2" "$3" | head -20
    status=1
  fi
}

for which in old new; do
  cli=${!which}
  "$cli" eval --backend "$backend" --model "$model" --task coref --samples "$samples" \
    --policies "$policies" --sparsity 0.5,0.8 --json "$work/$which.json" \
    --per-sample "$work/$which.samples.jsonl" >"$work/$which.eval.txt"
  # The table without its wall-time line, the JSON without timing fields.
  grep -v ' s for ' "$work/$which.eval.txt" >"$work/$which.table.txt"
  python3 -c 'import json,sys
d=json.load(open(sys.argv[1]))
def strip(x):
    if isinstance(x,dict): return {k:strip(v) for k,v in x.items() if "second" not in k and k!="model"}
    if isinstance(x,list): return [strip(v) for v in x]
    return x
print(json.dumps(strip(d),sort_keys=True,indent=1))' "$work/$which.json" >"$work/$which.json.txt"
  for policy in h2o quest; do
    "$cli" generate --backend "$backend" --model "$model" --prompt "The place is: the old mill. Later the place is" \
      --max-new 24 --policy "$policy" --sparsity 0.5 --ids >"$work/$which.gen.$policy.txt"
  done
  if [[ $policies == *tokenbutler* ]]; then
    "$cli" score --backend "$backend" --model "$model" --text-file "$work/text.txt" \
      --policy tokenbutler --sparsity 0.5 --json >"$work/$which.score.txt"
  else
    "$cli" score --backend "$backend" --model "$model" --tokens 1,5,9,2,33,7,7,12 --policy h2o \
      --sparsity 0.5 --json >"$work/$which.score.txt"
  fi
done
same "coref table, $samples samples x {$policies} x {0.5, 0.8} ($backend)" "$work/old.table.txt" "$work/new.table.txt"
same "coref JSON (accuracy, coverage, effective sparsity per layer and head)" "$work/old.json.txt" "$work/new.json.txt"
same "coref per-sample results" "$work/old.samples.jsonl" "$work/new.samples.jsonl"
same "generate --ids, h2o at 0.5" "$work/old.gen.h2o.txt" "$work/new.gen.h2o.txt"
same "generate --ids, quest at 0.5" "$work/old.gen.quest.txt" "$work/new.gen.quest.txt"
same "score --json (nll, argmax, ppl)" "$work/old.score.txt" "$work/new.score.txt"

echo
echo "speed: bench --context $context on $bench_model ($backend), $rounds rounds alternating"
for round in $(seq "$rounds"); do
  for which in old new; do
    cli=${!which}
    "$cli" bench --backend "$backend" --model "$bench_model" --context "$context" --steps 64 --json \
      >"$work/bench.$which.$round.json"
  done
done
python3 - "$work" "$rounds" <<'EOF'
import json, statistics, sys
work, rounds = sys.argv[1], int(sys.argv[2])
med = {}
for which in ("old", "new"):
    values = [json.load(open(f"{work}/bench.{which}.{r}.json"))["step_seconds_median"] for r in range(1, rounds + 1)]
    med[which] = statistics.median(values)
    print(f"  {which}: dense step median of medians {med[which]*1e3:.3f} ms  (rounds: " +
          ", ".join(f"{v*1e3:.3f}" for v in values) + ")")
print(f"  new / old = {med['new'] / med['old']:.3f}")
EOF
exit $status
