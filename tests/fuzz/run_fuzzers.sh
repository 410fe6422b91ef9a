#!/usr/bin/env bash
# Runs each libFuzzer target for a bounded time on a scratch copy of its seed corpus, as many at
# once as the machine has cores (each fuzzer is one process on one core), printing each one's
# tail in a fixed order; exits non-zero when any of them found a crash or failed to run.
# usage: run_fuzzers.sh FUZZ_BUILD_DIR SECONDS_PER_TARGET
set -euo pipefail
bin_dir=$1
seconds=${2:-60}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
at_once=${KVLENS_FUZZ_JOBS:-$(nproc 2>/dev/null || echo 1)}
pairs=(fuzz_safetensors_header:corpus_safetensors fuzz_tokenizer_json:corpus_tokenizer
  fuzz_kvtrace:corpus_kvtrace fuzz_gguf:corpus_gguf)
run_one() {  # target corpus: the fuzzer's output goes to $work/<target>.log
  local target=$1 corpus=$2
  mkdir -p "$work/$corpus" "$work/run-$target"
  cp -r "$here/$corpus/." "$work/$corpus/" 2>/dev/null || true
  # (its own folder: crash files land in the working directory)
  (cd "$work/run-$target" && "$bin_dir/$target" -max_total_time="$seconds" -timeout=10 \
    -rss_limit_mb=2048 -print_final_stats=1 "$work/$corpus" >"$work/$target.log" 2>&1)
}
failed=0
for ((first = 0; first < ${#pairs[@]}; first += at_once)); do
  pids=() names=()
  for pair in "${pairs[@]:first:at_once}"; do
    target=${pair%%:*}
    echo "fuzzing $target for ${seconds}s"
    run_one "$target" "${pair##*:}" &
    pids+=($!) names+=("$target")
  done
  for i in "${!pids[@]}"; do
    status=0
    wait "${pids[$i]}" || status=$?
    echo "-- ${names[$i]} (exit $status)"
    tail -n 12 "$work/${names[$i]}.log"
    if [ "$status" -ne 0 ]; then failed=1; fi
  done
done
if [ "$failed" -ne 0 ]; then
  echo "fuzzers: a target failed (its output above)" >&2
  exit 1
fi
echo "fuzzers: no crash found"
