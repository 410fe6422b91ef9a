#!/usr/bin/env bash
# Lockstep benchmark (issue 4's bar: 10 policies stepped together cost at most 3x one dense run at
# the same context). At 128 and 512 tokens of context, REPEATS times each, it runs two processes in
# turn:
#  - `kvlens-cli bench --policies`: a dense session and a lockstep session of every policy in one
#    process, taking turns in blocks of 8 steps (the first step of a block, which finds the caches
#    full of the other session's data, untimed);
#  - `kvlens-cli bench` alone: the dense session by itself, the reference a user stepping one dense
#    run sees (its weights and cache stay in the last-level cache between steps).
# It prints the medians of the step times, the steps/s and both ratios (lockstep over the dense
# steps of the same process, and over the dense process alone), the same for the fastest quarter
# of the runs (25th percentiles: the figures of a quiet machine), then each run's own work (its
# attention and its policy's selection and observation; dense shows its attention alone).
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
    common=(--model "$model" --context "$context" --steps 64 --copy-mb 16 --threads "$threads"
      --cpu-kernels "$kernels" --json)
    "$build/app/kvlens-cli" bench "${common[@]}" --policies "$policies" --sparsity 0.5
    "$build/app/kvlens-cli" bench "${common[@]}"
  done | python3 -c '
import json, statistics, sys
text = sys.stdin.read()
objects, depth, start = [], 0, 0
for i, ch in enumerate(text):  # the runs print one JSON object each
    if ch == "{":
        depth += 1
        if depth == 1: start = i
    elif ch == "}":
        depth -= 1
        if depth == 0: objects.append(json.loads(text[start:i + 1]))
runs = [o for o in objects if "lockstep" in o]
alone = [o["step_seconds_median"] for o in objects if "lockstep" not in o]
dense = statistics.median(r["step_seconds_median"] for r in runs)
lock = statistics.median(r["lockstep"]["step_seconds_median"] for r in runs)
ratio = statistics.median(r["lockstep"]["ratio_to_dense"] for r in runs)
dense_alone = statistics.median(alone)
print("context %4d: %d-run lockstep %.3f ms/step (%.1f steps/s); dense in the same process %.3f ms "
      "(%.0f steps/s), ratio %.2f (median of %d runs; per run: %s); dense alone %.3f ms "
      "(%.0f steps/s), ratio %.2f" % (runs[0]["context"], runs[0]["lockstep"]["runs"], lock * 1e3,
      1 / lock, dense * 1e3, 1 / dense, ratio, len(runs),
      " ".join("%.2f" % r["lockstep"]["ratio_to_dense"] for r in runs), dense_alone * 1e3,
      1 / dense_alone, lock / dense_alone))
def quarter(values):
    values = sorted(values)
    return values[len(values) // 4]
dense_q = quarter(r["step_seconds_median"] for r in runs)
lock_q = quarter(r["lockstep"]["step_seconds_median"] for r in runs)
alone_q = quarter(alone)
print("  fastest quarter: lockstep %.3f ms (%.1f steps/s); dense in the same process %.3f ms, "
      "ratio %.2f; dense alone %.3f ms, ratio %.2f" % (lock_q * 1e3, 1 / lock_q, dense_q * 1e3,
      lock_q / dense_q, alone_q * 1e3, lock_q / alone_q))
tasks = [r["lockstep"].get("run_tasks", []) for r in runs]
if tasks and tasks[0]:
    print("  per-run work (attention + policy select/observe of one run on its thread, median):  " +
          "  ".join("%s %.2f ms" % (task["policy"], statistics.median(
              t[i]["task_seconds_median"] for t in tasks) * 1e3) for i, task in enumerate(tasks[0])))
'
done
