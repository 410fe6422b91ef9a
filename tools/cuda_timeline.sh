#!/usr/bin/env bash
# A kernel timeline of one command on a GPU machine without Nsight Systems: builds
# tools/cuda_trace.cpp (a CUPTI injection library) against the CUDA toolkit, runs the command
# with it injected, keeps the trace as CSV and prints tools/cuda_timeline.py's analysis.
# usage: tools/cuda_timeline.sh TRACE.csv [cuda_timeline.py options] -- COMMAND [ARGS...]
#   e.g. tools/cuda_timeline.sh /tmp/lockstep.csv --layers 16 -- build/app/kvlens-cli bench \
#          --model /tmp/kb/llama-1b --backend cuda --context 512 --steps 12 --policies dense,h2o
# Environment: CUDA_HOME (default /usr/local/cuda), CXX (default c++). Tracing slows the host's
# launches a little (the bench's step times under it read 3-6% higher).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
[ $# -ge 3 ] || { sed -n '2,9p' "$0" >&2; exit 2; }
trace="$1"; shift
options=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do options+=("$1"); shift; done
[ "${1:-}" = "--" ] && [ $# -ge 2 ] || { echo "cuda_timeline.sh: want '-- COMMAND'" >&2; exit 2; }
shift
cuda="${CUDA_HOME:-/usr/local/cuda}"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
lib="$scratch/libkvlens_cuda_trace.so"
cupti_dirs=("$cuda/lib64" "$cuda/extras/CUPTI/lib64" "$cuda/lib")
link=()
for d in "${cupti_dirs[@]}"; do link+=("-L$d" "-Wl,-rpath,$d"); done
"${CXX:-c++}" -O2 -shared -fPIC -I"$cuda/include" -I"$cuda/extras/CUPTI/include" \
  "$here/cuda_trace.cpp" -o "$lib" "${link[@]}" -lcupti
CUDA_INJECTION64_PATH="$lib" KVLENS_CUDA_TRACE="$trace" "$@"
[ -s "$trace" ] || { echo "cuda_timeline.sh: $trace: no trace written (the command made no CUDA calls, or CUPTI refused)" >&2; exit 1; }
python3 "$here/cuda_timeline.py" "$trace" ${options[@]+"${options[@]}"}
