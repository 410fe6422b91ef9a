#!/usr/bin/env bash
# The CUDA build of the kvlens module on a GPU machine with torch (a venv at $PY, default
# /opt/torch/.venv/bin/python3, with pybind11 and numpy), then python/tests/gpu_torch.py: torch
# policies on CUDA tensors through DLPack against the built-in h2o, and the Python time per step.
# ICU_DIR: an ICU (include/unicode, lib/libicuuc.so*, libicudata.so*) where the machine has no
# libicu-dev (the dev VM's, carried). Usage: tools/python_gpu_check.sh [ICU_DIR]
set -euo pipefail
root=$PWD
icu=${1:-/usr}
[ "$icu" = /usr ] || (cd $icu/lib && for n in uc data; do ln -sf libicu$n.so.72.1 libicu$n.so.72; ln -sf libicu$n.so.72.1 libicu$n.so; done)
export LD_LIBRARY_PATH=$icu/lib:${LD_LIBRARY_PATH:-}
py=${PY:-/opt/torch/.venv/bin/python3}
start=$(date +%s)
cmake -S . -B /tmp/b -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVLENS_CUDA=ON -DKVLENS_QT=OFF \
  -DKVLENS_BUILD_TESTS=OFF -DICU_ROOT=$icu -DPython3_EXECUTABLE=$py \
  -Dpybind11_DIR=$($py -c 'import pybind11; print(pybind11.get_cmake_dir())') > /tmp/cfg.log 2>&1 || { tail -30 /tmp/cfg.log; exit 1; }
grep "kvlens:" /tmp/cfg.log
ninja -C /tmp/b -j16 _kvlens kvlens-cli kvlens_h2o_c > /tmp/build.log 2>&1 || { grep -E "error|Error" -A5 /tmp/build.log | head -60; exit 1; }
grep -E "warning" /tmp/build.log | grep -v "^/usr\|nvcc" | head -20 || true
echo "build: $(( $(date +%s) - start )) s"
cd python/tests
PYTHONPATH=/tmp/b/python:$($py -c "import site; print(site.getsitepackages()[0])") KVLENS_CLI_PATH=/tmp/b/app/kvlens-cli $py gpu_torch.py
