#!/usr/bin/env bash
# Regenerates the app's pictures in the docs: app.png (the README's) and one PNG per view, each
# taken by the real window (BUILD/app/kvlens) under Xvfb at 1600x1000 on the bundled demo model,
# driven by --script (app/gui/script_runner.h) with a fresh settings folder. Fails loudly: a
# missing tool or binary, a failing script line, or a missing, mis-sized or blank picture.
#   tools/screenshots.sh [BUILD_DIR=build] [OUT_DIR=docs/screenshots] [NAME...]
# (NAME: only those pictures; KVLENS_SCREENSHOT_STEP: how many steps to take first, default 108)
# A new view is one line in SHOTS below: "name|script line; script line; ...".
set -euo pipefail
die() { echo "screenshots.sh: $*" >&2; exit 1; }

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$(cd "${1:-$root/build}" 2>/dev/null && pwd) || die "no build folder '${1:-$root/build}'"
out=${2:-$root/docs/screenshots}
app=$build/app/kvlens
width=1600 height=1000
# How far every picture has stepped: near the end of co-reference sample 0 (110 decode steps),
# inside the final mention that reads back the location.
step=${KVLENS_SCREENSHOT_STEP:-108}

# What each picture shows, after the default session (dense, tokenbutler, h2o, quest at 50%; the
# first three compared) has recorded up to $step.
SHOTS=(
  "app|view heads"
  "heads|view heads"
  "heads-detail|view heads; head 7 1; detail on"
  "predicted|view predicted; compare tokenbutler,h2o; head 7 1"
  "retention|view retention; compare tokenbutler,h2o"
  "consensus|view consensus"
  "logits|view logits"
  "dark|theme dark; view heads"
  "history|compare tokenbutler,h2o; view retention; click-token 1 40"
  "generate|runs dense,tokenbutler@0.5,h2o@0.5,streaming@0.9; open-prompt Tom had a red ball. He liked to play with it every day in the park. One day; generate 40"
  "help|help on"
)

# Only the pictures named after the two folders, if any.
if [ $# -gt 2 ]; then
  wanted=()
  for name in "${@:3}"; do
    match=""
    for shot in "${SHOTS[@]}"; do [ "${shot%%|*}" = "$name" ] && match=$shot; done
    [ -n "$match" ] || die "no picture named '$name' (known: $(printf '%s ' "${SHOTS[@]%%|*}"))"
    wanted+=("$match")
  done
  SHOTS=("${wanted[@]}")
fi

command -v xvfb-run >/dev/null || die "xvfb-run not found (Debian: xvfb xauth)"
[ -x "$app" ] || die "no app at $app (build it: ninja -C $build kvlens)"
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# width x height of a PNG from its IHDR chunk (no image library needed)
png_size() {
  od -An -tu1 -j16 -N8 "$1" |
    awk '{printf "%dx%d", $1*16777216+$2*65536+$3*256+$4, $5*16777216+$6*65536+$7*256+$8}'
}

shrink() {
  # pngquant: 256 colours, lossy but invisible on these flat-coloured views; optipng: lossless.
  # (pngquant exits non-zero when it keeps the original: too large or below the quality floor)
  if command -v pngquant >/dev/null; then
    pngquant --force --skip-if-larger --quality 70-95 --output "$1" -- "$1" || true
  fi
  if command -v optipng >/dev/null; then optipng -quiet -o2 "$1"; fi
}

for shot in "${SHOTS[@]}"; do
  name=${shot%%|*}
  commands=${shot#*|}
  dir=$work/$name
  mkdir -p "$dir/config"
  {
    echo "goto $step"
    echo "wait-idle"
    tr ';' '\n' <<<"$commands" | sed 's/^ *//'
    echo "wait-idle"
    echo "wait 300"  # a few frames after the last change, so the picture shows it
    echo "screenshot $dir/shot.png"
    echo "quit"
  } >"$dir/script.txt"
  echo "screenshots.sh: $name ($commands)"
  # The app draws with OpenGL: an offscreen Qt platform from the caller must not reach it.
  # From the checkout, with the model named relative to it, so the sidebar shows no local path
  # (and an empty model cache: no model this machine fetched is offered in the pictures).
  if ! (cd "$root" && env -u QT_QPA_PLATFORM XDG_CONFIG_HOME="$dir/config" KVLENS_MODEL_CACHE="$dir/no-models" timeout 180 \
    xvfb-run -a -f "$dir/Xauthority" -s "-screen 0 ${width}x${height}x24" \
    "$app" --model assets/models/demo --script "$dir/script.txt") >"$dir/log.txt" 2>&1; then
    cat "$dir/log.txt" >&2
    die "$name: the app failed (its output above)"
  fi
  [ -s "$dir/shot.png" ] || { cat "$dir/log.txt" >&2; die "$name: no picture written"; }
  # The window opens at its first size (1480 x 920 on this screen), the picture is the window.
  size=$(png_size "$dir/shot.png")
  w=${size%x*} h=${size#*x}
  if [ "$w" -lt 1200 ] || [ "$w" -gt "$width" ] || [ "$h" -lt 700 ] || [ "$h" -gt "$height" ]; then
    die "$name: picture is $size, expected the window within ${width}x${height}"
  fi
  # A blank or black window compresses to almost nothing; a drawn view is tens of kB.
  bytes=$(stat -c %s "$dir/shot.png")
  [ "$bytes" -gt 20000 ] || die "$name: picture of $bytes bytes looks blank"
  shrink "$dir/shot.png"
  cp "$dir/shot.png" "$out/$name.png"
done

total=$(du -cb "$out"/*.png | tail -1 | cut -f1)
echo "screenshots.sh: ${#SHOTS[@]} made; the PNGs in $out come to $((total / 1024)) KiB"
