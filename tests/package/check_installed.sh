#!/usr/bin/env bash
# Runs kvlens-cli eval (tiny: 2 co-reference samples) and, with --app, the headless kvlens
# dashboard from BIN_DIR in a fresh folder with KVLENS_ASSETS_DIR unset, and checks their outputs:
# the bundled files (pools, demo model, predictor) must be found from the executables' location.
#   check_installed.sh BIN_DIR MODEL_DIR [--app]
set -euo pipefail
bin=$(cd "$1" && pwd)
model=$2
app=${3:-}
work=$(mktemp -d "${TMPDIR:-/tmp}/kvlens-installed.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work"  # unrelated to the source and build trees
unset KVLENS_ASSETS_DIR

echo "== $bin/kvlens-cli eval (from $work)"
policies=dense,h2o
"$bin/kvlens-cli" policies >policies.txt
if [ -f "$model/predictor.safetensors" ] && grep -q '^tokenbutler ' policies.txt; then
  policies=dense,h2o,tokenbutler
fi
"$bin/kvlens-cli" eval --model "$model" --task coref --samples 2 --policies "$policies" \
  --sparsity 0.5 --json eval.json
grep -q '"accuracy"' eval.json || { echo "eval.json has no results" >&2; exit 1; }
"$bin/kvlens-cli" coref-samples --count 2 --seed 1 --out samples.jsonl
[ "$(wc -l <samples.jsonl)" -eq 2 ] || { echo "coref-samples wrote no samples" >&2; exit 1; }

if [ "$app" = --app ]; then
  echo "== $bin/kvlens --headless (the bundled demo model)"
  env -u DISPLAY -u WAYLAND_DISPLAY -u QT_QPA_PLATFORM "$bin/kvlens" --headless --out dashboard
  pngs=$(find dashboard -name '*.png' | wc -l)
  [ "$pngs" -gt 0 ] || { echo "the headless dashboard wrote no PNG" >&2; exit 1; }
  echo "dashboard: $pngs PNG files"
fi
echo "ok"
