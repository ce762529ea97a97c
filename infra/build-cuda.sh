#!/usr/bin/env bash
# Builds the quarry CLI with CUDA (`--device cuda:N`), with the CUDA toolchain from PyPI.
# `make build-cuda` runs it; CI never does. Everything goes into $QUARRY_CACHE/cudavenv.
#
# Which CUDA: the target GPUs run driver 580 (CUDA 13.0), which loads PTX up to ISA 9.0. The 12.x
# wheels (`nvidia-cuda-nvcc-cu12`) ship only ptxas, not nvcc, so the toolchain is the 13.0 release
# pinned exactly (nvcc, nvvm, headers, CCCL, cuBLAS, cuRAND, NVRTC): its PTX is what driver 580 loads,
# where a newer 13.x nvcc would emit PTX that driver refuses.
#
# Variables:
#   CUDA_COMPUTE_CAP  compute capability without the dot (default 90: H100, H200)
#   NVCC_CCBIN        host C++ compiler for nvcc, if the default one is too new for it
#   CHECK_ONLY=1      type-check the CUDA build (kernels compiled to PTX, nothing linked); this works
#                     on a machine without an NVIDIA driver, a full build needs its libcuda.so.1
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
CACHE="${QUARRY_CACHE:-$HOME/.cache/quarry}"
VENV="$CACHE/cudavenv"
test -x "$VENV/bin/python" || python3 -m venv "$VENV"
"$VENV/bin/pip" install --quiet \
  "nvidia-cuda-nvcc==13.0.88" "nvidia-nvvm==13.0.88" "nvidia-cuda-runtime==13.0.*" \
  "nvidia-cuda-crt==13.0.*" "nvidia-cuda-cccl==13.0.*" "nvidia-cuda-nvrtc==13.0.88" \
  "nvidia-cublas==13.0.*" "nvidia-curand==10.4.0.*"
NV="$("$VENV/bin/python" -c 'import os, nvidia; print(os.path.join(os.path.dirname(nvidia.__file__), "cu13"))')"
export CUDA_ROOT="$NV" CUDA_PATH="$NV"
export PATH="$NV/bin:$PATH"
export CPATH="$NV/include:$NV/include/cccl:${CPATH:-}"
export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-90}"
nvcc --version | tail -1
if [ "${CHECK_ONLY:-0}" = 1 ]; then
  cargo check --release -p quarry --features cuda
  echo "the CUDA build type-checks (kernels compiled for compute capability $CUDA_COMPUTE_CAP)."
  exit 0
fi
# candle links cudarc against the CUDA libraries; the wheels carry only versioned names, and
# libcuda comes with the driver. Unversioned links for the linker go into one folder.
LINK="$CACHE/cudalink"
mkdir -p "$LINK"
for lib in cublas cublasLt curand nvrtc cudart; do
  real="$(ls "$NV"/lib/lib$lib.so.* 2>/dev/null | head -1)"
  [ -n "$real" ] && ln -sf "$real" "$LINK/lib$lib.so"
done
driver="$(ldconfig -p | awk '/libcuda\.so\.1 /{print $NF; exit}')"
if [ -z "$driver" ]; then
  echo "error: no NVIDIA driver here (libcuda.so.1 not found), so the CUDA binary cannot be linked." >&2
  echo "To fix: run this on the GPU machine, or CHECK_ONLY=1 make build-cuda to type-check." >&2
  exit 2
fi
ln -sf "$driver" "$LINK/libcuda.so"
export LIBRARY_PATH="$LINK:${LIBRARY_PATH:-}"
cargo build --release -p quarry --features cuda
echo "built ${CARGO_TARGET_DIR:-target}/release/quarry with CUDA (compute capability $CUDA_COMPUTE_CAP)."
echo "run it with: LD_LIBRARY_PATH=$NV/lib:\$LD_LIBRARY_PATH quarry generate --device cuda:0 --prompt …"
