#!/usr/bin/env bash
# A tour of the tools underneath the product (`make tour`): model facts, tokenization, the chat
# template, constraints compiled against the vocabulary, free and constrained generation, on the
# real models. `make demo` is the product itself: a dataset job on real documents.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
Q="${QUARRY:?set QUARRY to the quarry binary}"
GEMMA=models/gemma-3-270m-q4_k_m.gguf
SAMPLE='{"name": "Ünïcødé 😀", "n": 12345}'

section() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

section "Model facts: quarry info"
"$Q" info

section "Tokenizing a sample: quarry tokenize '$SAMPLE'"
"$Q" tokenize "$SAMPLE"
"$Q" tokenize --json "$SAMPLE"

section "A prompt rendered with the model's chat template: quarry chat-template"
"$Q" chat-template --system "You extract JSON records." "Invoice #12 from ACME, total 19.99 EUR."

section "The large-vocabulary model: quarry info --model $GEMMA"
"$Q" info --model "$GEMMA" | grep -v '^chat template'
"$Q" tokenize --model "$GEMMA" "$SAMPLE"

SCHEMA=schemas/debian-package.json
section "A JSON Schema as a constraint: quarry grammar compile --schema $SCHEMA"
"$Q" grammar compile --schema "$SCHEMA"

section "What the model may write after '{\"name\":\"jq\",': quarry grammar mask"
"$Q" grammar mask --schema "$SCHEMA" --prefix '{"name":"jq",' --json

section "Checking a record through the token path: quarry grammar accepts --canonicalize --explain"
printf '%s' '{"version": "1.6-2.1", "name": "jq", "maintainer": "ChangZhuo Chen <czchen@debian.org>", "depends": ["libc6 (>= 2.34)"], "summary": "lightweight and flexible command-line JSON processor"}' \
  | "$Q" grammar accepts --schema "$SCHEMA" --canonicalize --explain

section "The model runtime: quarry generate --chat (greedy, CPU)"
"$Q" generate --chat --prompt "What is the Debian package manager called? Answer in one sentence." --max-tokens 48

section "Constrained generation through the engine: quarry generate --schema $SCHEMA --stats"
"$Q" generate --chat --schema "$SCHEMA" --max-tokens 160 --stats --prompt "Extract the package as JSON.

Package: jq
Version: 1.6-2.1
Maintainer: ChangZhuo Chen <czchen@debian.org>
Depends: libjq1 (= 1.6-2.1), libc6 (>= 2.34)
Homepage: https://github.com/stedolan/jq
Description: lightweight and flexible command-line JSON processor"

section "A choice constraint: quarry generate --choice yes --choice no"
"$Q" generate --chat --prompt "Is jq a command-line JSON processor? Answer yes or no." --choice yes --choice no
