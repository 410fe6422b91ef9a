#!/usr/bin/env bash
# What a policy plug-in costs against the built-in it copies (issue 39 item 5): kvlens-cli bench
# of a one-run session of each policy at the same context, rounds alternating between them, and
# per plug-in the extra time of its step over the built-in's as a share of a dense step (the
# target: at most 5%), with the time spent in its own code and in host copies.
#
# usage: tools/bench_plugins.sh CLI MODEL [--backend cpu|cuda] [--context N] [--rounds R]
#                               [--steps N] [--sparsity X] BUILTIN=PLUGIN.so[:ID] ...
#   e.g. tools/bench_plugins.sh build/app/kvlens-cli assets/models/demo \
#          h2o=build/examples/policies/libkvlens_h2o_c.so:h2o_c h2o=examples/policies/h2o.py:h2o_py
#   (a .py file is a Python policy file: --policy-file)
# ID defaults to the built-in's id with _c. Prints one line per plug-in; medians of the rounds'
# medians.
set -euo pipefail
[ $# -ge 3 ] || { sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
cli=$1 model=$2
shift 2
backend=cpu context=512 rounds=5 steps=64 sparsity=0.5 pairs=()
while [ $# -gt 0 ]; do
  case $1 in
    --backend) backend=$2; shift 2 ;;
    --context) context=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --sparsity) sparsity=$2; shift 2 ;;
    *=*) pairs+=("$1"); shift ;;
    *) echo "bench_plugins.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for pair in "${pairs[@]}"; do
  builtin=${pair%%=*} rest=${pair#*=}
  file=${rest%%:*} id=${rest#*:}
  [ "$id" = "$rest" ] && id=${builtin}_c
  load=(--plugin "$file")
  [[ $file == *.py ]] && load=(--policy-file "$file")
  for round in $(seq "$rounds"); do
    for policy in "$builtin" "$id"; do
      "$cli" bench --backend "$backend" --model "$model" --context "$context" --steps "$steps" \
        --policies "$policy" --sparsity "$sparsity" "${load[@]}" --json \
        >"$work/$builtin.$policy.$round.json"
    done
  done
  python3 - "$work" "$builtin" "$id" "$rounds" "$backend" "$context" <<'EOF'
import json, statistics, sys
work, builtin, plugin, rounds, backend, context = sys.argv[1:7]
def load(policy):
    return [json.load(open(f"{work}/{builtin}.{policy}.{r}.json")) for r in range(1, int(rounds) + 1)]
b, p = load(builtin), load(plugin)
med = lambda xs: statistics.median(xs)
dense = med([d["step_seconds_median"] for d in b + p])
step_b = med([d["lockstep"]["step_seconds_median"] for d in b])
step_p = med([d["lockstep"]["step_seconds_median"] for d in p])
task = p[0]["lockstep"]["run_tasks"][0]
own = med([d["lockstep"]["run_tasks"][0].get("plugin_seconds_median", 0.0) for d in p])
copies = med([d["lockstep"]["run_tasks"][0].get("plugin_copy_seconds_median", 0.0) for d in p])
extra = (step_p - step_b) / dense
print(f"{plugin:>14} vs {builtin:<12} {backend} ctx {context}: dense {dense*1e3:.3f} ms, "
      f"{builtin} {step_b*1e3:.3f} ms, {plugin} {step_p*1e3:.3f} ms per step; extra "
      f"{extra*100:+.1f}% of a dense step (target <= 5%); in its code {own*1e3:.3f} ms, "
      f"copies {copies*1e3:.3f} ms")
EOF
done
