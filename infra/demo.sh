#!/usr/bin/env bash
# `make demo`: a real extraction on this machine, CPU only, no external services.
#   1. Real documents: every Nth installed package's raw entry in /var/lib/dpkg/status (text nobody
#      here wrote), as JSONL shards under target/demo/packages/.
#   2. `quarry extract --pipeline pipelines/debian-packages.toml`: name, version, maintainer,
#      dependencies, homepage and summary of each package, constrained by
#      schemas/debian-package.json, to Parquet under target/demo/out/.
#   3. `quarry inspect`: what was written, with sample rows.
#   4. Accuracy per field against ground truth parsed from the same entries (infra/demo_report.py).
#   5. The same job again: every shard is published already, so nothing is redone.
# DEMO_PACKAGES (default 16) sets the number of documents; DEMO_MODEL (a GGUF path, or a checkpoint
# folder) runs another model than the job file's, e.g. DEMO_MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf,
# or DEMO_MODEL=models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf (an optional model of
# infra/models.json, fetched here the first time: 1.1 GB).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
Q="${QUARRY:?set QUARRY to the quarry binary}"
N="${DEMO_PACKAGES:-16}"
DEMO=target/demo
MODEL=()
[ -n "${DEMO_MODEL:-}" ] && MODEL=(--model "$DEMO_MODEL")
# An optional model of infra/models.json is fetched the first time it is asked for.
if [ -n "${DEMO_MODEL:-}" ] && [ ! -e "$DEMO_MODEL" ] && [ "$(dirname "$DEMO_MODEL")" = models ] \
    && grep -q "\"$(basename "$DEMO_MODEL")\"" infra/models.json; then
  python3 infra/fetch_models.py models "${QUARRY_CACHE:-$HOME/.cache/quarry}/wheels" "$(basename "$DEMO_MODEL")"
fi

section() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

if [ ! -r /var/lib/dpkg/status ]; then
  echo "make demo reads the Debian package database (/var/lib/dpkg/status), which this machine lacks." >&2
  echo "Run it on Debian or Ubuntu, or point pipelines/debian-packages.toml at your own JSONL." >&2
  exit 2
fi

section "1. Real documents: $N package entries from /var/lib/dpkg/status"
# A fresh run each time (the shards are rebuilt; the outputs from an earlier demo are removed).
rm -rf "$DEMO/packages" "$DEMO/out"
python3 infra/dpkg_jsonl.py "$DEMO/packages" --packages "$N" --shard-size 8
head -c 400 "$DEMO/packages/part-00000.jsonl"; echo " …"

section "2. Extraction: quarry extract --pipeline pipelines/debian-packages.toml"
"$Q" extract --pipeline pipelines/debian-packages.toml "${MODEL[@]}"

section "3. What was written: quarry inspect $DEMO/out"
"$Q" inspect "$DEMO/out" --sample 2 --brief

section "4. Accuracy per field against the dpkg database"
"$Q" inspect "$DEMO/out/packages" --all --json > "$DEMO/inspect.json"
python3 infra/demo_report.py "$DEMO/packages" "$DEMO/inspect.json"

section "5. The same job again: published shards are skipped"
"$Q" extract --pipeline pipelines/debian-packages.toml "${MODEL[@]}"
echo
echo "Parquet files: $DEMO/out/packages/ (records) and $DEMO/out/packages-rejects/ (rejects)."
echo "Read them with pyarrow, DuckDB or Spark, or: quarry inspect $DEMO/out"
