#!/usr/bin/env bash
# Builds the quarry CLI with CUDA (`--device cuda:N`), with the CUDA toolchain from PyPI.
# `make build-cuda` runs it; CI never does. Everything goes into $QUARRY_CACHE/cudavenv.
#
# The toolchain (CUDA 13.0 from PyPI, and why that version) is set up by infra/cuda-env.sh.
#
# Variables:
#   CUDA_COMPUTE_CAP  compute capability without the dot (default 90: H100, H200)
#   NVCC_CCBIN        host C++ compiler for nvcc, if the default one is too new for it
#   CUDA_TESTS=1      also build the model tests with CUDA (run them with QUARRY_TEST_DEVICE=cuda:0)
#   CHECK_ONLY=1      type-check the CUDA build (kernels compiled, nothing linked)
# A machine without an NVIDIA driver builds too: the binary is linked against a stub libcuda.so.1
# and uses the real driver of the GPU machine it runs on.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source infra/cuda-env.sh
# quarry's own kernels (workspace/quarry-model/kernels/*.cu): quarry-model's build.rs compiles them
# into the binary; here each is also assembled by ptxas for the target GPU, whose report
# (registers, spills, shared memory) is the first thing to read about a kernel change.
PTX="${CARGO_TARGET_DIR:-target}/ptx"
mkdir -p "$PTX"
for cu in workspace/quarry-model/kernels/*.cu; do
  name="$(basename "$cu" .cu)"
  nvcc -ptx -O3 -arch="compute_$CUDA_COMPUTE_CAP" -o "$PTX/$name.ptx" "$cu"
  ptxas -arch="sm_$CUDA_COMPUTE_CAP" -v -o /dev/null "$PTX/$name.ptx" 2>&1 | sed "s|^|$name: |"
done
if [ "${CHECK_ONLY:-0}" = 1 ]; then
  cargo check --release -p quarry --features cuda
  echo "the CUDA build type-checks (kernels compiled for compute capability $CUDA_COMPUTE_CAP)."
  exit 0
fi
cargo build --release -p quarry --features cuda
if [ "${CUDA_TESTS:-0}" = 1 ]; then
  # The model's correctness tests, to run on the GPU with QUARRY_TEST_DEVICE=cuda:0 (and
  # QUARRY_ROOT=<checkout> where the checkout is not where they were built).
  cargo test --release -p quarry-model --features cuda --no-run
fi
echo "built ${CARGO_TARGET_DIR:-target}/release/quarry with CUDA (compute capability $CUDA_COMPUTE_CAP)."
echo "run it with: LD_LIBRARY_PATH=$NV/lib:\$LD_LIBRARY_PATH quarry generate --device cuda:0 --prompt …"
