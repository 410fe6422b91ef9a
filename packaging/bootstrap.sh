#!/usr/bin/env bash
# kvlens set-up in one command, for a fresh Debian 12 / Ubuntu machine: installs the Debian
# packages kvlens builds with (apt; idempotent; as root or through sudo), configures and builds,
# then runs the demo (default) or the whole test suite (--test).
#   packaging/bootstrap.sh          install, build, open the app on the bundled demo model
#   packaging/bootstrap.sh --test   install, build, run every test (ctest; sanitizer build; fuzzers)
# A real model, SmolLM2-135M-Instruct (98 MB GGUF, tools/get_model.sh smollm2): --test fetches it
# best-effort for the `real` tests (KVLENS_FETCH_REAL_MODEL=0: never; the set-up never fails on
# it); KVLENS_FETCH_REAL_MODEL=1 fetches it in demo mode too and prints its path.
set -euo pipefail

usage() { sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
mode=demo
case "${1:-}" in
  "" | --demo) mode=demo ;;
  --test) mode=test ;;
  -h | --help) usage ;;
  *) echo "bootstrap.sh: unknown argument '$1'" >&2; usage ;;
esac

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${KVLENS_BUILD_DIR:-$root/build}
jobs=$(nproc 2>/dev/null || echo 2)
# Each stage's heading says how long the set-up has run so far (CI reads where the time went).
log() { printf '\n\033[1m== %s\033[0m (at %d s)\n' "$*" "$SECONDS"; }

# --- dependencies -----------------------------------------------------------------------------
packages=(build-essential cmake pkg-config python3 zlib1g-dev libicu-dev nlohmann-json3-dev
  libcli11-dev catch2
  # the kvlens Python module and --policy-file (built with Debian's python3)
  python3-dev python3-numpy pybind11-dev
  # the figures and the desktop app: Qt 6, Dear ImGui, the bundled font; Xvfb and Mesa to open
  # the window without a display
  qt6-base-dev qt6-svg-dev libqt6opengl6-dev libxkbcommon-dev libimgui-dev fonts-dejavu-core
  xvfb xauth libgl1-mesa-dri)
# test mode also makes a Python venv for the tools' tests (python3 -m venv needs python3-venv)
if [ "$mode" = test ]; then packages+=(clang libclang-rt-dev python3-venv); fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "Installing Debian packages: ${missing[*]}"
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "bootstrap.sh: need root or sudo to install ${missing[*]}" >&2; exit 1; }
    sudo=sudo
  fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  log "Debian packages already installed"
fi

# --- Python tools venv and the real model ----------------------------------------------------
# Test mode: tools/requirements.txt in $build/tools-venv for the unit:tools tests (reinstalled only
# when the requirements change: their hash is kept in a stamp file; without the venv unit:tools is
# skipped), then the real model (best-effort; KVLENS_FETCH_REAL_MODEL=0: never) and, in the venv,
# the F32 Hugging Face folder transformers makes from it (tools/make_real_fixtures.py --hf-only).
# The `real` tests find them through KVLENS_REAL_MODEL; without them they are skipped, and the
# summary says so. All of it is downloads: in test mode it runs beside the build (its output is
# printed after the build) and the tests wait for it.
venv="$build/tools-venv"
prepare_log="$build/prepare-tools.log"
prepare_env="$build/prepare-tools.env"  # what the preparation found, as shell assignments
prepare_tools() {
  local tools_python="" real_model="" real_model_note="the set-up did not fetch it: KVLENS_FETCH_REAL_MODEL=0"
  if [ "$mode" = test ]; then
    local requirements="$root/tools/requirements.txt" want
    want=$(sha256sum "$requirements" | cut -d' ' -f1)
    if [ -x "$venv/bin/python" ] && [ "$(cat "$venv/requirements.sha256" 2>/dev/null)" = "$want" ]; then
      echo "Python tools venv up to date ($venv)"
      tools_python="$venv/bin/python"
    else
      echo "Installing tools/requirements.txt into $venv (PyTorch: a large download)"
      if python3 -m venv "$venv" && "$venv/bin/python" -m pip install --quiet -r "$requirements"; then
        echo "$want" >"$venv/requirements.sha256"
        tools_python="$venv/bin/python"
      else
        echo "bootstrap.sh: warning: the tools venv could not be made; unit:tools will be skipped" >&2
      fi
    fi
  fi
  if [ "$fetch_real" = 1 ]; then
    echo "Fetching the real model (tools/get_model.sh smollm2; best-effort)"
    if real_model=$("$root/tools/get_model.sh" smollm2); then
      real_model_note="$real_model"
      echo "real model: $real_model"
      if [ "$mode" = demo ]; then echo "Open it in the app with File > Open (a .gguf)."; fi
    else
      real_model_note="tools/get_model.sh smollm2 failed with exit $?, see above"
      real_model=""
      echo "bootstrap.sh: warning: tools/get_model.sh smollm2 failed; the real tests will be skipped" >&2
    fi
  fi
  if [ "$mode" = test ] && [ -n "$real_model" ] && [ -n "$tools_python" ]; then
    local real_hf="${real_model%.gguf}-f32-hf"
    if [ -f "$real_hf/config.json" ]; then
      echo "real model, F32 folder: $real_hf"
    elif "$tools_python" "$root/tools/make_real_fixtures.py" --hf-only --gguf "$real_model" \
      --hf-dir "$real_hf"; then
      echo "real model, F32 folder: $real_hf"
    else
      rm -rf "$real_hf"
      echo "bootstrap.sh: warning: the F32 folder of the real model could not be made; its tests will be skipped" >&2
    fi
  fi
  printf 'tools_python=%q\nreal_model=%q\nreal_model_note=%q\n' "$tools_python" "$real_model" \
    "$real_model_note" >"$prepare_env"
}
fetch_real=${KVLENS_FETCH_REAL_MODEL:-$([ "$mode" = test ] && echo 1 || echo 0)}
mkdir -p "$build"
rm -f "$prepare_env"
prepare_pid=""
if [ "$mode" = test ]; then
  log "The tools venv and the real model: preparing beside the build (log: $prepare_log)"
  prepare_tools >"$prepare_log" 2>&1 &
  prepare_pid=$!
elif [ "$fetch_real" = 1 ]; then
  log "The real model"
  prepare_tools
fi
# The preparation's results (after it ends): tools_python, real_model, real_model_note.
finish_prepare() {
  if [ -n "$prepare_pid" ]; then
    wait "$prepare_pid" || true
    log "The tools venv and the real model (prepared beside the build)"
    cat "$prepare_log"
    prepare_pid=""
  fi
  tools_python="" real_model="" real_model_note="the preparation did not finish"
  # shellcheck disable=SC1090
  [ -f "$prepare_env" ] && source "$prepare_env"
  if [ -n "$real_model" ]; then export KVLENS_REAL_MODEL="$real_model"; fi
}
# The venv's path is known before it exists (CMake only records it); a failed venv is configured
# away again before the tests.
tools_cmake=()
if [ "$mode" = test ]; then tools_cmake=(-DKVLENS_TOOLS_PYTHON="$venv/bin/python"); fi

# --- build ------------------------------------------------------------------------------------
log "Configuring and building kvlens in $build"
# Without a GPU the CUDA backend is still compiled (that it builds is tested), for Hopper's machine
# code alone: the PTX for newer GPUs would run nowhere here and took a third of nvcc's time.
# With one, the list is CMakeLists.txt's default (a list left in the cache by a run without a GPU
# is dropped). KVLENS_CUDA_ARCHITECTURES sets it (CMake's CMAKE_CUDA_ARCHITECTURES) either way.
if [ -n "${KVLENS_CUDA_ARCHITECTURES:-}" ]; then
  cuda_cmake=(-DCMAKE_CUDA_ARCHITECTURES="$KVLENS_CUDA_ARCHITECTURES")
elif ! nvidia-smi -L >/dev/null 2>&1; then
  cuda_cmake=(-DCMAKE_CUDA_ARCHITECTURES=90a-real)
else
  cuda_cmake=(-UCMAKE_CUDA_ARCHITECTURES)
fi
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release ${tools_cmake[@]+"${tools_cmake[@]}"} \
  "${cuda_cmake[@]}" >/dev/null
cmake --build "$build" -j"$jobs"
cli="$build/app/kvlens-cli"

if [ "$mode" = demo ]; then
  finish_prepare
  app="$build/app/kvlens"
  log "kvlens: the desktop app on the bundled demo model (co-reference sample 0; dense, tokenbutler, h2o, quest)"
  echo "Keys: Right/Left step, Shift+Right steps 10, Space plays, Ctrl+E exports the view."
  echo "The headless interface is $cli (try: $cli --help)."
  # Without a display the app renders its dashboard to PNG files and prints where.
  exec "$app" --out "$build/dashboard"
fi

# --- tests ------------------------------------------------------------------------------------
finish_prepare
if [ -z "$tools_python" ]; then
  cmake -S "$root" -B "$build" -DKVLENS_TOOLS_PYTHON= >/dev/null  # unit:tools then says it skipped
fi
log "Running the test suite (ctest: unit, parity, real, ui, cuda, package)"
ctest --test-dir "$build" --output-on-failure -j"$jobs"
# ctest counts skipped tests as passed and shows no output for them: say plainly whether the
# real model ran, with each skip's reason (the tests print "real test skipped: <why>").
real_skips=$(grep -h '^real test skipped: ' "$build"/Testing/Temporary/LastTest*.log 2>/dev/null | sort -u || true)
if grep -q '^real test skipped: the real model is not fetched' <<<"$real_skips"; then
  log "real tests: SKIPPED, no real model ($real_model_note)"
else
  log "real tests: ran on ${KVLENS_REAL_MODEL:-the model already in the cache}"
fi
[ -z "$real_skips" ] || printf '%s\n' "$real_skips"

log "Sanitizer build (ASan + UBSan) and its unit tests"
san="$build-sanitize"
cmake -S "$root" -B "$san" -DCMAKE_BUILD_TYPE=Debug -DKVLENS_SANITIZE=ON -DKVLENS_CUDA=OFF >/dev/null
cmake --build "$san" -j"$jobs" --target kvlens_unit_tests
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir "$san" --output-on-failure -j"$jobs" -L unit
if [ -x "$build/app/kvlens" ]; then
  log "The window and kvlens-cli figure under the sanitizers (ui tests)"
  cmake --build "$san" -j"$jobs" --target kvlens kvlens-cli kvlens_ui_tests
  # Leaks are checked by the unit tests: the window's run ends with the X, D-Bus and GL
  # libraries' own allocations, which are not ours to free.
  # A cross-section, not every ui test (all of them took 577 s under the sanitizers on 2 cores,
  # most of it the same window drawing again): the scripted session, the dialogs and script
  # errors, a plug-in in the app, re-recording, the token search and every export path.
  # KVLENS_SANITIZE_UI=all runs them all.
  san_ui=(-R 'window loads, steps|bad model folders|failing script command|bad input commands|policy plug-in loads in the app|re-recording keeps|token search|kvlens-cli figure|export|without a display')
  if [ "${KVLENS_SANITIZE_UI:-}" = all ]; then san_ui=(); fi
  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir "$san" --output-on-failure -j"$jobs" -L ui ${san_ui[@]+"${san_ui[@]}"}
fi

if command -v clang++ >/dev/null; then
  log "Fuzzing the parsers (libFuzzer, bounded time)"
  fuzz="$build-fuzz"
  cmake -S "$root" -B "$fuzz" -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVLENS_FUZZ=ON -DKVLENS_CUDA=OFF >/dev/null
  cmake --build "$fuzz" -j"$jobs" --target kvlens_fuzzers
  "$root/tests/fuzz/run_fuzzers.sh" "$fuzz/tests/fuzz" "${KVLENS_FUZZ_SECONDS:-30}"
else
  log "clang++ not found: fuzzers skipped"
fi
log "All tests passed"
