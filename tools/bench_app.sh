#!/usr/bin/env bash
# The app's frame rate while the engine steps (issue 5: 30 fps or better): the real window under
# Xvfb (Mesa llvmpipe, software OpenGL): for each view, a fresh recording of the default demo
# session played at 30 steps/s for 3 seconds (the engine stepping on its thread), then paused for
# 1.5 s; prints the frame rate the window reports (frames over the last second) after each phase. A benchmark, not a test: it depends on the machine and its load.
# usage: tools/bench_app.sh BUILD_DIR
set -euo pipefail
build=${1:?usage: bench_app.sh BUILD_DIR}
script=$(mktemp)
trap 'rm -f "$script"' EXIT
{
  echo "speed 30"
  for view in heads predicted retention consensus logits; do
    echo "view $view"
    echo "open-sample 0"  # a fresh recording: the engine steps while the view is measured
    echo "play"
    echo "wait 3000"
    echo "report"
    echo "pause"
    echo "wait 1500"
    echo "report"
  done
  echo "quit"
} >"$script"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
XDG_CONFIG_HOME=$(mktemp -d) xvfb-run -a -s "-screen 0 1600x1000x24" \
  "$build/app/kvlens" --script "$script" 2>/dev/null |
  awk '/^script: view/ {view = $3} /^script: play/ {phase = "stepping"}
       /^script: pause/ {phase = "paused"} /^report/ {print view, phase ":", $0}'

