#!/usr/bin/env bash
# CPU decode benchmark: makes (once) a random ~100M-parameter F32 Llama with
# tools/make_random_model.py, then runs `kvlens-cli bench` with 1 and all threads at 128 and 512
# tokens of context. Each run prints the weight-read bandwidth next to a memcpy bandwidth
# measured in the same process, and their ratio (the bar: >= 0.5).
# usage: tools/bench_cpu.sh BUILD_DIR [MODEL_DIR]
set -euo pipefail
build=${1:?usage: bench_cpu.sh BUILD_DIR [MODEL_DIR]}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
model=${2:-$build/bench-model-100m-f32}
if [ ! -f "$model/model.safetensors" ]; then
  python3 "$root/tools/make_random_model.py" --out "$model" --params-target 100M --dtype F32
fi
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
for context in 128 512; do
  for threads in 1 0; do
    echo "--- context $context, threads $([ $threads = 0 ] && echo all || echo $threads)"
    "$build/app/kvlens-cli" bench --model "$model" --context "$context" --steps 32 --threads "$threads" |
      grep -E 'backend|step time|steps/s|weight read|memcpy|ratio'
  done
done
