#!/usr/bin/env bash
# Runs every test in the workspace (unit, integration, doc) and ends with one summary line.
set -uo pipefail
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
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
