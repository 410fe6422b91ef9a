#!/usr/bin/env bash
# Builds kvlens on the GPU machine, which has nvcc, CMake, ninja and Python with torch but none of
# Debian's -dev packages: the .debs are downloaded here (on a Debian 12 machine) into .deps/ and
# carried, then unpacked into a scratch prefix there. No Qt (the CLI, the tests, the plug-ins and
# the Python module; the app has its own bundle, tools/app_gpu_bundle.sh).
#
#   here:  mkdir -p .deps && (cd .deps && apt-get download nlohmann-json3-dev libcli11-dev catch2 \
#            pybind11-dev libicu-dev libicu72 zlib1g-dev)
#   there: tools/gpu_build.sh SOURCE_DIR BUILD_DIR [TARGETS...] [-- CMAKE_ARGS...]
#          (device tool: carry .deps; run from the repository root)
# Prints the configure summary and the build time; exits non-zero on a failed build. The scratch
# prefix is /tmp/kvlens-deps; LD_LIBRARY_PATH must name its lib folder to run what was built
# (ICU): source the printed line. The Python module links its C++ runtime statically: the
# machine's compiler (/opt/gcc) is newer than the libstdc++ its Python and torch load first, and
# the module crashed in libstdc++'s inline code against the older one (seen on an H100, a
# segmentation fault in read_utf8_code_point as a session was made).
set -euo pipefail
[ $# -ge 2 ] || { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
source_dir=$1 build=$2
shift 2
targets=() cmake_args=()
while [ $# -gt 0 ]; do
  if [ "$1" = -- ]; then shift; cmake_args=("$@"); break; fi
  targets+=("$1"); shift
done
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
deps=/tmp/kvlens-deps
if [ ! -d $deps/usr ]; then
  mkdir -p $deps
  for deb in "$root"/.deps/*.deb; do dpkg -x "$deb" $deps; done
  # ICU's unversioned names point at the versioned files of libicu72's .deb.
  (cd $deps/usr/lib/x86_64-linux-gnu && for n in uc data i18n io; do
     [ -e libicu$n.so.72 ] || continue; ln -sf libicu$n.so.72 libicu$n.so; done)
  # zlib1g-dev's libz.so points at the runtime of zlib1g, which is the machine's own: link it
  # there (its static libz.a is not position-independent, so the Python module cannot take it).
  (cd $deps/usr/lib/x86_64-linux-gnu && rm -f libz.a &&
     for z in /lib/x86_64-linux-gnu/libz.so.1 /usr/lib/x86_64-linux-gnu/libz.so.1; do
       [ -e $z ] && ln -sf $z libz.so && break; done)
fi
export LD_LIBRARY_PATH=$deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
python=${PYTHON:-$(command -v python3)}
start=$(date +%s)
cmake -S "$source_dir" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVLENS_CUDA=ON \
  -DKVLENS_QT=OFF -DCMAKE_CUDA_ARCHITECTURES=90a-real \
  -DCMAKE_PREFIX_PATH="$deps/usr;$deps/usr/share/cmake;$deps/usr/lib/cmake" \
  -DICU_ROOT=$deps/usr -DCMAKE_CXX_FLAGS="-isystem $deps/usr/include" \
  -DPython3_EXECUTABLE="$python" -Dpybind11_DIR=$deps/usr/lib/cmake/pybind11 \
  "-DCMAKE_MODULE_LINKER_FLAGS=-static-libstdc++ -static-libgcc -Wl,--exclude-libs,ALL" \
  ${cmake_args[@]+"${cmake_args[@]}"} >"$build.configure.log" 2>&1 ||
  { tail -40 "$build.configure.log"; exit 1; }
grep "kvlens:" "$build.configure.log" || true
ninja -C "$build" ${targets[@]+"${targets[@]}"} >"$build.build.log" 2>&1 ||
  { grep -E "FAILED:|error|undefined reference|cannot find" -A8 "$build.build.log" | grep -v "^\[" |
      cut -c1-400 | head -80; exit 1; }
echo "built $build in $(( $(date +%s) - start )) s"
echo "export LD_LIBRARY_PATH=$deps/usr/lib/x86_64-linux-gnu:\$LD_LIBRARY_PATH"
