#!/usr/bin/env bash
# Runs each libFuzzer target for a bounded time on a scratch copy of its seed corpus.
# usage: run_fuzzers.sh FUZZ_BUILD_DIR SECONDS_PER_TARGET
set -euo pipefail
bin_dir=$1
seconds=${2:-60}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for pair in fuzz_safetensors_header:corpus_safetensors fuzz_tokenizer_json:corpus_tokenizer \
  fuzz_kvtrace:corpus_kvtrace fuzz_gguf:corpus_gguf; do
  target=${pair%%:*}
  corpus=${pair##*:}
  mkdir -p "$work/$corpus"
  cp -r "$here/$corpus/." "$work/$corpus/" 2>/dev/null || true
  echo "fuzzing $target for ${seconds}s"
  (cd "$work" && "$bin_dir/$target" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 "$work/$corpus" 2>&1 | tail -n 12)
done
echo "fuzzers: no crash found"
