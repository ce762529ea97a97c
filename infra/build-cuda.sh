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
#   CUDA_TESTS=1      also build the model tests with CUDA (run them with QUARRY_TEST_DEVICE=cuda:0)
#   CHECK_ONLY=1      type-check the CUDA build (kernels compiled, nothing linked)
# A machine without an NVIDIA driver builds too: the binary is linked against a stub libcuda.so.1
# and uses the real driver of the GPU machine it runs on.
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
# quarry's own kernels (workspace/quarry-model/kernels/*.cu) to PTX for the driver to load, each
# checked by ptxas for the target GPU (registers and shared memory printed). They are not launched
# yet: the whole-batch paged attention is compared with its reference (src/ragged.rs) on a lent GPU.
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
# candle links cudarc against the CUDA libraries; the wheels carry only versioned names, and
# libcuda comes with the driver. Unversioned links for the linker go into one folder.
LINK="$CACHE/cudalink"
mkdir -p "$LINK"
for lib in cublas cublasLt curand nvrtc cudart; do
  real="$(ls "$NV"/lib/lib$lib.so.* 2>/dev/null | head -1)"
  [ -n "$real" ] && ln -sf "$real" "$LINK/lib$lib.so"
done
driver="$(ldconfig -p | awk '/libcuda\.so\.1 /{print $NF; exit}')"
if [ -n "$driver" ]; then
  ln -sf "$driver" "$LINK/libcuda.so"
else
  # No NVIDIA driver here (a build machine, a container build): link against a stub with the
  # driver's soname, made from the driver API cudarc declares. The binary then loads the real
  # libcuda.so.1 of the GPU machine it runs on, like the CUDA toolkit's own lib64/stubs.
  echo "no NVIDIA driver here: linking against a stub libcuda.so.1 (the GPU machine's driver is used at run time)"
  cudarc="$(cargo metadata --format-version 1 --locked --features quarry-model/cuda | python3 -c 'import json,sys; print(next(p["manifest_path"] for p in json.load(sys.stdin)["packages"] if p["name"] == "cudarc").rsplit("/", 1)[0])')"
  grep -ho 'fn cu[A-Za-z0-9_]*(' "$cudarc/src/driver/sys/mod.rs" | sort -u \
    | sed 's/^fn \(.*\)($/void \1(void) {}/' > "$LINK/cuda_stub.c"
  cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$LINK/libcuda.so" "$LINK/cuda_stub.c"
fi
export LIBRARY_PATH="$LINK:${LIBRARY_PATH:-}"
cargo build --release -p quarry --features cuda
if [ "${CUDA_TESTS:-0}" = 1 ]; then
  # The model's correctness tests, to run on the GPU with QUARRY_TEST_DEVICE=cuda:0 (and
  # QUARRY_ROOT=<checkout> where the checkout is not where they were built).
  cargo test --release -p quarry-model --features cuda --no-run
fi
echo "built ${CARGO_TARGET_DIR:-target}/release/quarry with CUDA (compute capability $CUDA_COMPUTE_CAP)."
echo "run it with: LD_LIBRARY_PATH=$NV/lib:\$LD_LIBRARY_PATH quarry generate --device cuda:0 --prompt …"
