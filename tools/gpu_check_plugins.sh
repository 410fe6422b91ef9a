#!/usr/bin/env bash
# Issue 39 on the GPU machine in one job (the device tool, carrying .deps; from the repository
# root): builds kvlens with the CUDA backend, the tests, the example plug-ins and the Python module
# for the machine's torch Python (tools/gpu_build.sh), then
#   1. the cuda test suite (the plug-ins' visible sets against the built-ins, the op table, ...);
#   2. python/tests/gpu_torch.py: torch policies on CUDA tensors through DLPack and NumPy ones
#      through host copies against the built-in h2o in lockstep, with the Python time per step;
#   3. on the Llama-3.2-1B shape (random BF16 weights) at 512 tokens, what a plug-in costs over
#      the built-in it copies (tools/bench_plugins.sh): the CUDA plug-in h2o_cuda, the C plug-in
#      h2o_c through host copies, and the Python policies h2o_torch (torch on the device) and
#      h2o_py (NumPy through host copies).
# usage: tools/gpu_check_plugins.sh OUT_DIR   (each part's output in OUT_DIR/*.txt)
set -euo pipefail
out=${1:?usage: tools/gpu_check_plugins.sh OUT_DIR}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0
py=${PYTHON:-$(command -v python3)}
pybind11_dir=$("$py" -c 'import pybind11; print(pybind11.get_cmake_dir())' 2>/dev/null ||
  echo /tmp/kvlens-deps/usr/lib/cmake/pybind11)
build=build-gpu
PYTHON=$py tools/gpu_build.sh . $build _kvlens kvlens-cli kvlens_cuda_tests kvlens_h2o_c \
  kvlens_quest_c kvlens_tokenbutler_c kvlens_keynorm_c kvlens_h2o_cuda -- -DKVLENS_BUILD_TESTS=ON \
  -Dpybind11_DIR="$pybind11_dir" 2>&1 | tee "$out/build.txt"
export LD_LIBRARY_PATH=/tmp/kvlens-deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
export KVLENS_ASSETS_DIR=$PWD/assets
# The embedded interpreter of kvlens-cli (--policy-file) finds torch and the module here.
export PYTHONPATH=$PWD/$build/python:$("$py" -c 'import site; print(site.getsitepackages()[0])')

[ "${SKIP_CUDA_TESTS:-0}" = 1 ] || {
echo "== 1. cuda tests"
ctest --test-dir $build -L cuda -j2 --timeout 300 2>&1 | tee "$out/cuda.txt" |
  grep -E "tests passed|Failed|\*\*\*" || true
}

echo "== 2. Python policies on CUDA"
(cd python/tests && KVLENS_CLI_PATH=$PWD/../../$build/app/kvlens-cli "$py" -X faulthandler \
  gpu_torch.py) 2>&1 | tee "$out/gpu_torch.txt" || echo "gpu_torch.py failed (above)"

echo "== 3. plug-in and Python policy cost, 1B shape, 512 tokens"
model=/tmp/kvlens-1b
[ -d $model ] || "$py" tools/make_random_model.py --out $model --hidden 2048 --layers 16 \
  --heads 32 --kv-heads 8 --intermediate 8192 --vocab 128256 --tie-embeddings --dtype BF16 \
  --max-positions 32768 >/dev/null
plugins=$build/examples/policies
tools/bench_plugins.sh $build/app/kvlens-cli $model --backend cuda --context 512 --rounds 3 \
  --steps 128 h2o=$plugins/libkvlens_h2o_cuda.so:h2o_cuda h2o=$plugins/libkvlens_h2o_c.so:h2o_c \
  h2o=examples/policies/h2o_torch.py:h2o_torch h2o=examples/policies/h2o.py:h2o_py 2>&1 |
  tee "$out/cost.txt"
