#!/usr/bin/env bash
# Issue 26 item 7: the desktop app's headless dashboard on the GPU machine with the CUDA backend,
# on the bundled demo model and on a 1B-shaped random checkpoint (Llama 3.2 1B's shape, BF16, with
# the Llama 3 vocabulary); prints the steps/s it records at and with the drawing of the views.
# Run from the repo root with .carry/app-gpu.tar.xz carried (made by tools/app_gpu_bundle.sh:
# the Qt+CUDA kvlens and every shared library it needs but glibc and CUDA's own).
# APP_GPU_BACKEND=cpu and APP_GPU_SKIP_1B=1 are for trying it on a machine without a GPU;
# APP_GPU_FORCE_LOADER=1 runs through the bundled glibc even where the machine's would do.
set -uo pipefail
OUT=${OUT:-/tmp/app-gpu-out}
backend=${APP_GPU_BACKEND:-cuda}
B=/tmp/app-gpu
rm -rf "$B"
tar -C /tmp -xJf .carry/app-gpu.tar.xz 2>/dev/null ||  # no xz on the machine: Python's lzma
  python3 -c 'import tarfile; tarfile.open(".carry/app-gpu.tar.xz").extractall("/tmp")' ||
  { echo "cannot unpack the bundle"; exit 1; }
cat "$B/BUILD_INFO"
mkdir -p "$OUT"

echo "== machine"
ldd --version 2>&1 | head -1
head -2 /etc/os-release
command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
echo "cpu: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"

# glibc: the bundle needs GLIBC_NEEDED; an older one runs everything through the bundled loader.
have_glibc=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')
need_glibc=$(cat "$B/GLIBC_NEEDED")
older() { [ "$1" != "$2" ] && [ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | head -1)" = "$1" ]; }
loader=""
if [ -z "$have_glibc" ] || older "$have_glibc" "$need_glibc" || [ -n "${APP_GPU_FORCE_LOADER:-}" ]; then
  loader="$B/glibc/ld-linux-x86-64.so.2"
  echo "glibc: the machine has ${have_glibc:-none found}, the bundle needs $need_glibc: running through the bundled glibc $need_glibc loader"
else
  echo "glibc: the machine has $have_glibc, the bundle needs $need_glibc: the machine's"
fi

# libstdc++ / libgcc_s: the newer of the machine's and the bundle's (both are backward compatible).
sys_cxx=$( (ldconfig -p 2>/dev/null | awk '/libstdc\+\+\.so\.6 .*x86-64/{print $NF; exit}') )
sys_cxx_v=$( [ -n "$sys_cxx" ] && grep -ao 'GLIBCXX_3\.4\.[0-9]*' "$sys_cxx" | sort -uV | tail -1)
gcc_dir=""
if [ -z "$sys_cxx_v" ] || older "$sys_cxx_v" "$(cat "$B/GLIBCXX_BUNDLED")" || [ -n "$loader" ]; then
  gcc_dir="$B/gcc:"
  echo "libstdc++: the bundle's ($(cat "$B/GLIBCXX_BUNDLED"); the machine's: ${sys_cxx_v:-none})"
else
  echo "libstdc++: the machine's $sys_cxx ($sys_cxx_v; the bundle's: $(cat "$B/GLIBCXX_BUNDLED"))"
fi

# CUDA's libraries (left out of the bundle): the toolkit's, else a pip wheel's.
cuda_dirs=""
site=$(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null)
for lib in libcudart.so.13 libcublas.so.13 libcublasLt.so.13; do
  for d in /usr/local/cuda/lib /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
           /usr/local/cuda-13*/lib64 $(for s in $site; do echo "$s"/nvidia/*/lib "$s"/nvidia/cu13/lib; done); do
    if [ -e "$d/$lib" ]; then
      case ":$cuda_dirs:" in *":$d:"*) ;; *) cuda_dirs="$cuda_dirs:$d" ;; esac
      break
    fi
  done
done
if [ -n "$cuda_dirs" ]; then echo "CUDA libraries from: ${cuda_dirs#:}"; else echo "CUDA libraries: none found beside the toolkit, the ldconfig cache's"; fi

# LD_LIBRARY_PATH for kvlens alone: the machine's own tools (python3, grep...) keep their libraries.
lib_path="$B/lib:$gcc_dir${cuda_dirs#:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "LD_LIBRARY_PATH for kvlens: $lib_path"
export QT_PLUGIN_PATH=$B/plugins QT_QPA_PLATFORM=offscreen QT_QPA_OFFSCREEN_NO_GLX=1
export FONTCONFIG_FILE=$B/fonts/fonts.conf KVLENS_ASSETS_DIR=$PWD/assets
export XDG_RUNTIME_DIR=$B/xdg && mkdir -p -m 0700 "$XDG_RUNTIME_DIR"
unset DISPLAY WAYLAND_DISPLAY
if [ -n "$loader" ]; then
  kvlens=("$loader" --library-path "$B/glibc:$lib_path" "$B/kvlens")
  missing=$("$loader" --library-path "$B/glibc:$lib_path" --list "$B/kvlens" 2>&1 | grep "not found")
else
  kvlens=(env LD_LIBRARY_PATH="$lib_path" "$B/kvlens")
  missing=$(LD_LIBRARY_PATH="$lib_path" ldd "$B/kvlens" 2>&1 | grep "not found")
fi
echo "ldd: ${missing:-every library found}"
[ -z "$missing" ] || exit 1

# The 1B-shaped checkpoint (random BF16 weights; no tokenizer of its own: Llama 3's, bundled).
if [ -z "${APP_GPU_SKIP_1B:-}" ]; then
  if [ ! -e /tmp/m1b/model.safetensors ]; then
    echo "== making /tmp/m1b"
    python3 tools/make_random_model.py --out /tmp/m1b --hidden 2048 --layers 16 --heads 32 \
      --kv-heads 8 --intermediate 8192 --vocab 128256 --tie-embeddings --dtype BF16 \
      --max-positions 32768 > /dev/null || { echo "make_random_model failed"; exit 1; }
  fi
  [ -e /tmp/m1b/tokenizer.json ] || gunzip -c "$B/llama3-tokenizer.json.gz" > /tmp/m1b/tokenizer.json
fi

# One headless dashboard: all five PNGs to /tmp, two of them (heads, retention) and the log to $OUT.
dashboard() {  # name, then kvlens's options
  local name=$1; shift
  local png=/tmp/app-gpu-png/$name
  rm -rf "$png" && mkdir -p "$OUT/$name"
  echo "== $name: kvlens --headless $*"
  timeout 300 "${kvlens[@]}" --headless --out "$png" "$@" > "$OUT/$name/run.log" 2>&1
  local rc=$?
  grep -v "^  /" "$OUT/$name/run.log" | tail -20
  echo "exit $rc"
  cp "$png"/kvlens-heads.png "$png"/kvlens-retention.png "$OUT/$name/" 2>/dev/null
  return $rc
}
status=0
dashboard app-demo --backend "$backend" || status=1
[ -n "${APP_GPU_SKIP_1B:-}" ] || dashboard app-1b --model /tmp/m1b --backend "$backend" || status=1
# The same demo dashboard on this machine's CPU, for comparison (no PNGs kept).
if [ "$backend" != cpu ]; then
  dashboard app-demo-cpu --backend cpu || status=1
  rm -f "$OUT"/app-demo-cpu/*.png
fi
echo "== steps/s"
grep -H "steps/s" "$OUT"/*/run.log | sed "s|$OUT/||; s|/run.log:| |"
exit $status
