# Sourced by the CUDA builds (build-cuda.sh, build-llama-cuda.sh): installs the pinned CUDA 13.0
# toolchain from PyPI into $QUARRY_CACHE/cudavenv and exports what compilers and linkers need.
#
# Which CUDA: the target GPUs run driver 580 (CUDA 13.0), which loads PTX up to ISA 9.0. The 12.x
# wheels (`nvidia-cuda-nvcc-cu12`) ship only ptxas, not nvcc, so the toolchain is the 13.0 release
# pinned exactly (nvcc, nvvm, headers, CCCL, cuBLAS, cuRAND, NVRTC): its PTX is what driver 580
# loads, where a newer 13.x nvcc would emit PTX that driver refuses.
#
# Exports NV (the toolkit root inside the wheels), CUDA_ROOT, CUDA_PATH, CUDA_COMPUTE_CAP (default
# 90: H100, H200), PATH, CPATH and LIBRARY_PATH. The wheels carry only versioned library names,
# so unversioned links for the linker go into $NV/lib; libcuda comes with the driver: where there
# is none (a build machine), a stub with the driver's soname is made from the driver API cudarc
# declares, and the binaries load the real libcuda.so.1 of the GPU machine they run on, as with
# the CUDA toolkit's own lib64/stubs.
CACHE="${QUARRY_CACHE:-$HOME/.cache/quarry}"
VENV="$CACHE/cudavenv"
test -x "$VENV/bin/python" || python3 -m venv "$VENV"
"$VENV/bin/pip" install --quiet \
  "nvidia-cuda-nvcc==13.0.88" "nvidia-nvvm==13.0.88" "nvidia-cuda-runtime==13.0.*" \
  "nvidia-cuda-crt==13.0.*" "nvidia-cuda-cccl==13.0.*" "nvidia-cuda-nvrtc==13.0.88" \
  "nvidia-cublas==13.0.*" "nvidia-curand==10.4.0.*" "cmake==4.*" "ninja==1.*"
NV="$("$VENV/bin/python" -c 'import os, nvidia; print(os.path.join(list(nvidia.__path__)[0], "cu13"))')"
export NV CUDA_ROOT="$NV" CUDA_PATH="$NV"
export PATH="$NV/bin:$VENV/bin:$PATH"
export CPATH="$NV/include:$NV/include/cccl:${CPATH:-}"
export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-90}"
for lib in cublas cublasLt curand nvrtc cudart; do
  real="$(ls "$NV"/lib/lib$lib.so.* 2>/dev/null | head -1)"
  [ -n "$real" ] && ln -sf "$(basename "$real")" "$NV/lib/lib$lib.so"
done
mkdir -p "$NV/lib/stubs"
driver="$(ldconfig -p | awk '/libcuda\.so\.1 /{print $NF; exit}')"
if [ -n "$driver" ]; then
  ln -sf "$driver" "$NV/lib/stubs/libcuda.so"
elif [ ! -s "$NV/lib/stubs/libcuda.so" ]; then
  echo "no NVIDIA driver here: linking against a stub libcuda.so.1 (the GPU machine's driver is used at run time)"
  cudarc="$(cargo metadata --format-version 1 --locked --features quarry-model/cuda | python3 -c 'import json,sys; print(next(p["manifest_path"] for p in json.load(sys.stdin)["packages"] if p["name"] == "cudarc").rsplit("/", 1)[0])')"
  grep -ho 'fn cu[A-Za-z0-9_]*(' "$cudarc/src/driver/sys/mod.rs" | sort -u \
    | sed 's/^fn \(.*\)($/void \1(void) {}/' > "$NV/lib/stubs/cuda_stub.c"
  cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$NV/lib/stubs/libcuda.so" "$NV/lib/stubs/cuda_stub.c"
fi
export LIBRARY_PATH="$NV/lib:$NV/lib/stubs:${LIBRARY_PATH:-}"
nvcc --version | tail -1
