#!/usr/bin/env bash
# Builds llama.cpp with CUDA, the peer `infra/gpu-check.sh` measures quarry against on the same GPU
# and the same GGUF: its `llama-batched-bench`, from the llama.cpp source that the pinned
# llama-cpp-python sdist ships (the same llama.cpp as the CPU fixtures and benchmarks), compiled
# with quarry's own CUDA toolchain (infra/cuda-env.sh) for one compute capability. CI never runs it.
#
# It builds on a machine without a GPU (a stub libcuda.so.1, as for quarry's CUDA build), so the
# device call carries a binary instead of spending GPU time compiling llama.cpp's CUDA kernels.
# Output: $QUARRY_CACHE/llama-cuda/bin/llama-batched-bench, linked statically against ggml and
# dynamically against the CUDA runtime and cuBLAS 13 (the GPU machine's PyTorch ships them).
# Variables: CUDA_COMPUTE_CAP (default 90), JOBS (default: the number of cores).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source infra/cuda-env.sh
VERSION="$(sed -n 's/^LLAMA_CPP_PYTHON := llama-cpp-python==//p' Makefile)"
SDIST_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
OUT="$CACHE/llama-cuda"
SRC="$OUT/src/llama_cpp_python-$VERSION/vendor/llama.cpp"
mkdir -p "$OUT/src"
if [ ! -d "$SRC" ]; then
  tarball="$OUT/src/llama_cpp_python-$VERSION.tar.gz"
  if ! echo "$SDIST_SHA256  $tarball" | sha256sum -c --quiet 2>/dev/null; then
    url="$(curl -fsSL https://pypi.org/simple/llama-cpp-python/ \
      | grep -o "https://[^\"#]*/llama_cpp_python-$VERSION.tar.gz" | head -1)"
    curl -fsSL -o "$tarball" "$url"
    echo "$SDIST_SHA256  $tarball" | sha256sum -c --quiet
  fi
  tar xzf "$tarball" -C "$OUT/src"
fi
# The CPU part for any x86-64 with AVX2 (no native tuning: the GPU machine's CPU is not this one,
# and a native build on a CPU with AMX crashes, see the Makefile's fixtures target).
cmake -S "$SRC" -B "$OUT/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$CUDA_COMPUTE_CAP-real" -DCMAKE_CUDA_COMPILER="$NV/bin/nvcc" \
  -DCUDAToolkit_ROOT="$NV" -DGGML_CUDA_NCCL=OFF -DBUILD_SHARED_LIBS=OFF \
  -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF \
  -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_OPENMP=OFF \
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=ON >"$OUT/cmake.log"
cmake --build "$OUT/build" --target llama-batched-bench -j "${JOBS:-$(nproc)}"
mkdir -p "$OUT/bin"
cp "$OUT/build/bin/llama-batched-bench" "$OUT/bin/"
strip "$OUT/bin/llama-batched-bench"
echo "llama.cpp $VERSION (llama-cpp-python) with CUDA for compute capability $CUDA_COMPUTE_CAP: $OUT/bin/llama-batched-bench"
