#!/usr/bin/env bash
# Checks and measures a CUDA build on a GPU machine, in one go (`make build-cuda CUDA_TESTS=1`
# first, or carry its outputs there):
#   1. the model's correctness tests on cuda:0 (paged = single-sequence forward, agreement with
#      the llama.cpp fixtures, greedy continuations);
#   2. `quarry generate --device cuda:0`, free and constrained;
#   3. `quarry bench --device cuda:0` over a batch-size sweep, JSON results into $RESULTS.
# Variables: QUARRY (the CUDA quarry binary), TESTS (folder of the CUDA model test binaries),
# RESULTS (default target/bench), BATCHES (default 1,8,32,64,128), DOCS (default 128), STATUS (the
# package database the documents come from; carry this machine's to compare devices on the same
# documents).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
Q="${QUARRY:?set QUARRY to the CUDA build of quarry}"
RESULTS="${RESULTS:-target/bench}"
mkdir -p "$RESULTS"
status=0
section() { printf '\n== %s\n' "$*"; }

section "GPU"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader || status=1

if [ -n "${TESTS:-}" ]; then
  for t in "$TESTS"/*; do
    section "model test $(basename "$t") on cuda:0"
    QUARRY_TEST_DEVICE=cuda:0 QUARRY_ROOT="$PWD" "$t" --test-threads 1 || status=1
  done
fi

section "quarry generate --device cuda:0"
"$Q" generate --device cuda:0 --chat --max-tokens 48 \
  --prompt "What is the Debian package manager called? Answer in one sentence." || status=1
"$Q" generate --device cuda:0 --chat --schema schemas/debian-package.json --max-tokens 160 --stats \
  --prompt "$(grep -A12 '^Package: dpkg$' "${STATUS:-/var/lib/dpkg/status}")" || status=1

section "quarry bench --device cuda:0"
"$Q" bench --device cuda:0 --status "${STATUS:-/var/lib/dpkg/status}" --batch "${BATCHES:-1,8,32,64,128}" --docs "${DOCS:-128}" \
  --out "$RESULTS/quarry-bench-cuda.json" || status=1
exit $status
