#!/usr/bin/env bash
# A local S3 API for development and tests: moto_server on 127.0.0.1.
#   infra/local-s3.sh start [PORT]   # prints the endpoint URL
#   infra/local-s3.sh stop
# Clients: AWS_ENDPOINT=<url> AWS_ALLOW_HTTP=true AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test
# AWS_REGION=us-east-1.
set -euo pipefail
# shellcheck source=infra/service-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/service-lib.sh"
VENV="${QUARRY_TESTVENV:-$QUARRY_CACHE/testvenv}"

launch() {
    exec nohup "$VENV/bin/moto_server" -H 127.0.0.1 -p "$1"
}

service_main moto_server "$VENV/bin/moto_server" 15000 "http://" "$@"
