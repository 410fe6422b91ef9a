#!/usr/bin/env bash
# Makes tests/fixtures/gguf_tokenizer/ (reference ids and detokenized texts from llama.cpp's own
# tokenizer, SmolLM2's tokenizer metadata): fetches llama.cpp's source (the copy inside the
# llama-cpp-python sdist on PyPI), builds only libllama and tools/gguf_tokenize_batch.cpp against
# it in a cache folder (never in the repository), then runs tools/gguf_reference_ids.py.
# Usage: tools/gguf_reference_ids.sh SmolLM2-135M-Instruct.Q4_1.gguf [CACHE_DIR]
set -euo pipefail

gguf_file=${1:?usage: $0 SmolLM2-135M-Instruct.Q4_1.gguf [cache dir]}
cache=${2:-${XDG_CACHE_HOME:-$HOME/.cache}/kvlens/llama-tokenize}
repo=$(cd "$(dirname "$0")/.." && pwd)
shared=${KVLENS_SHARED_DIR:-$repo/../shared}
version=0.3.36  # llama-cpp-python, whose sdist vendors llama.cpp

mkdir -p "$cache"
if [ ! -x "$cache/venv/bin/python" ]; then
  python3 -m venv --system-site-packages "$cache/venv"
  "$cache/venv/bin/pip" install -q gguf numpy
fi
src=$cache/llama_cpp_python-$version/vendor/llama.cpp
if [ ! -d "$src" ]; then
  "$cache/venv/bin/pip" download -q --no-deps --no-binary :all: -d "$cache" \
    "llama-cpp-python==$version"
  tar -xzf "$cache/llama_cpp_python-$version.tar.gz" -C "$cache"
fi
tool=$cache/gguf_tokenize_batch
if [ ! -x "$tool" ] || [ "$repo/tools/gguf_tokenize_batch.cpp" -nt "$tool" ]; then
  cmake -S "$src" -B "$cache/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF -DGGML_OPENMP=OFF -DGGML_NATIVE=OFF >/dev/null
  ninja -C "$cache/build" llama
  g++ -std=c++17 -O2 -I"$src/include" -I"$src/ggml/include" "$repo/tools/gguf_tokenize_batch.cpp" \
    "$cache/build/src/libllama.a" "$cache/build/ggml/src/libggml.a" \
    "$cache/build/ggml/src/libggml-cpu.a" "$cache/build/ggml/src/libggml-base.a" \
    -lpthread -ldl -lm -o "$tool"
fi

"$cache/venv/bin/python" "$repo/tools/gguf_reference_ids.py" \
  --tokenize-batch "$tool" --llama-src "$src" \
  --llama-version "llama.cpp as vendored in llama-cpp-python $version (PyPI sdist)" \
  --smollm2-gguf "$gguf_file" --shared "$shared" --out "$repo/tests/fixtures/gguf_tokenizer"
