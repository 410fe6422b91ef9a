#!/usr/bin/env bash
# Lockstep benchmark (issue 4's bar: 10 policies stepped together cost at most 3x one dense run at
# the same context): `kvlens-cli bench --policies` steps a dense session and a lockstep session of
# every policy alternately in one process, at 128 and 512 tokens of context, REPEATS times each;
# prints the medians of the step times, the steps/s and the ratio, the same for the fastest
# quarter of the runs (the figure of a quiet machine: a shared VM's load slows dense steps more),
# then each run's own work (its attention in the layers where it computes its own logits, and its
# policy's selection and observation; dense shows its attention alone) for the breakdown.
# usage: tools/bench_lockstep.sh BUILD_DIR [MODEL_DIR] [REPEATS] [THREADS] [CPU_KERNELS]
# (CPU_KERNELS: auto, avx2 or generic, as kvlens-cli's --cpu-kernels)
set -euo pipefail
build=${1:?usage: bench_lockstep.sh BUILD_DIR [MODEL_DIR] [REPEATS] [THREADS] [CPU_KERNELS]}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
model=${2:-$root/assets/models/demo}
repeats=${3:-5}
threads=${4:-0}
kernels=${5:-auto}
policies=dense,oracle,streaming,h2o,snapkv,quest,keydiff,tokenfilter,lazyllm,random
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
echo "model: $model; lockstep runs: $policies at sparsity 0.5; threads: $threads (0 = all);" \
  "CPU kernels: $kernels"
for context in 128 512; do
  for i in $(seq "$repeats"); do
    "$build/app/kvlens-cli" bench --model "$model" --context "$context" --steps 64 --copy-mb 16 \
      --threads "$threads" --cpu-kernels "$kernels" --policies "$policies" --sparsity 0.5 --json
  done | python3 -c '
import json, statistics, sys
text = sys.stdin.read()
runs, depth, start = [], 0, 0
for i, ch in enumerate(text):  # the runs print one JSON object each
    if ch == "{":
        depth += 1
        if depth == 1: start = i
    elif ch == "}":
        depth -= 1
        if depth == 0: runs.append(json.loads(text[start:i + 1]))
dense = statistics.median(r["step_seconds_median"] for r in runs)
lock = statistics.median(r["lockstep"]["step_seconds_median"] for r in runs)
ratio = statistics.median(r["lockstep"]["ratio_to_dense"] for r in runs)
print("context %4d: dense %.2f ms/step (%.0f steps/s), %d-run lockstep %.2f ms/step (%.1f steps/s), "
      "ratio %.2f (median of %d runs; per run: %s)" % (runs[0]["context"], dense * 1e3, 1 / dense,
      runs[0]["lockstep"]["runs"], lock * 1e3, 1 / lock, ratio, len(runs),
      " ".join("%.2f" % r["lockstep"]["ratio_to_dense"] for r in runs)))
# On a shared VM the host load slows dense steps more than lockstep steps, so the ratio of the
# medians moves with it; the ratio of the fastest quarter of each (25th percentiles over the
# runs) is the quiet-machine figure.
def quarter(values):
    values = sorted(values)
    return values[len(values) // 4]
dense_q = quarter(r["step_seconds_median"] for r in runs)
lock_q = quarter(r["lockstep"]["step_seconds_median"] for r in runs)
print("  fastest quarter: dense %.3f ms, lockstep %.3f ms (%.1f steps/s), ratio %.2f" %
      (dense_q * 1e3, lock_q * 1e3, 1 / lock_q, lock_q / dense_q))
tasks = [r["lockstep"].get("run_tasks", []) for r in runs]
if tasks and tasks[0]:
    print("  per-run work (attention + policy select/observe of one run on its thread, median):  " +
          "  ".join("%s %.2f ms" % (task["policy"], statistics.median(
              t[i]["task_seconds_median"] for t in tasks) * 1e3) for i, task in enumerate(tasks[0])))
'
done
