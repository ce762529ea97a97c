#!/usr/bin/env bash
# Runs every test in the workspace (unit, integration, doc) and ends with one summary line.
# Starts the real services the end-to-end tests use, and stops them on exit:
#   tansu (Kafka protocol) → QUARRY_BROKERS, moto_server (S3) → QUARRY_S3_ENDPOINT.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
QUARRY_CACHE="${QUARRY_CACHE:-$HOME/.cache/quarry}"
export QUARRY_RUN="${QUARRY_RUN:-$(mktemp -d)}"
export QUARRY_TESTVENV="$QUARRY_CACHE/testvenv"
log="$(mktemp)"
cleanup() {
    bash "$ROOT/infra/local-kafka.sh" stop || true
    bash "$ROOT/infra/local-s3.sh" stop || true
    rm -f "$log"
}
trap cleanup EXIT
QUARRY_BROKERS="$(bash "$ROOT/infra/local-kafka.sh" start 19092)" || exit 1
QUARRY_S3_ENDPOINT="$(bash "$ROOT/infra/local-s3.sh" start 15000)" || exit 1
export QUARRY_BROKERS QUARRY_S3_ENDPOINT
echo "services: kafka (tansu) at $QUARRY_BROKERS, s3 (moto) at $QUARRY_S3_ENDPOINT"
cargo test --workspace --no-fail-fast 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
awk '/^test result:/ {
        for (i = 1; i <= NF; i++) {
            if ($(i+1) ~ /^passed/)  p += $i
            if ($(i+1) ~ /^failed/)  f += $i
            if ($(i+1) ~ /^ignored/) s += $i
        }
     }
     END { printf "summary: %d passed, %d failed, %d skipped\n", p, f, s }' "$log"
exit "$rc"
