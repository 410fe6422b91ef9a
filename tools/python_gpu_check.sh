#!/usr/bin/env bash
# On the GPU machine (the device tool, carrying .deps as tools/gpu_build.sh says, from the
# repository root): the CUDA build of the kvlens module for the machine's Python with torch
# (PYTHON, default python3; its pip pybind11 when it has one, else Debian's from .deps), then
# python/tests/gpu_torch.py: torch policies on CUDA tensors through DLPack and NumPy ones through
# host copies, against the built-in h2o in lockstep, with the Python time per step.
set -euo pipefail
py=${PYTHON:-$(command -v python3)}
build=/tmp/kvlens-python-build
pybind11_dir=$("$py" -c 'import pybind11; print(pybind11.get_cmake_dir())' 2>/dev/null ||
  echo /tmp/kvlens-deps/usr/lib/cmake/pybind11)
PYTHON=$py tools/gpu_build.sh . $build _kvlens kvlens-cli kvlens_h2o_c -- -Dpybind11_DIR=$pybind11_dir
export LD_LIBRARY_PATH=/tmp/kvlens-deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
# kvlens-cli's embedded interpreter finds torch through PYTHONPATH (a venv is not its prefix).
site=$("$py" -c 'import site; print(site.getsitepackages()[0])')
cd python/tests
PYTHONPATH=$build/python:$site KVLENS_CLI_PATH=$build/app/kvlens-cli "$py" gpu_torch.py
