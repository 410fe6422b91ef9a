#!/usr/bin/env bash
# The app's frame rate while the engine steps (issue 5: 30 fps or better): the real window under
# Xvfb (Mesa llvmpipe, software OpenGL), playing the default demo session at 30 steps/s on each
# view for 4 seconds, then idle for 2; prints the frame rate the window reports (frames over the
# last second) for each phase. A benchmark, not a test: it depends on the machine and its load.
# usage: tools/bench_app.sh BUILD_DIR
set -euo pipefail
build=${1:?usage: bench_app.sh BUILD_DIR}
script=$(mktemp)
trap 'rm -f "$script"' EXIT
{
  echo "speed 30"
  for view in heads predicted retention consensus logits; do
    echo "view $view"
    echo "play"
    echo "wait 4000"
    echo "report"
  done
  echo "pause"
  echo "wait 2000"
  echo "report"
  echo "quit"
} >"$script"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
XDG_CONFIG_HOME=$(mktemp -d) xvfb-run -a -s "-screen 0 1600x1000x24" \
  "$build/app/kvlens" --script "$script" 2>/dev/null | grep -E "^script: view|^report|^script: pause"
