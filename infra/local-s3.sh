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
case "${1:-}" in
start)
    PORT="${2:-15000}"
    [[ -x "$VENV/bin/moto_server" ]] || { echo "moto_server not found in $VENV: run infra/setup-test.sh" >&2; exit 1; }
    "$0" stop >/dev/null 2>&1 || true
    nohup "$VENV/bin/moto_server" -H 127.0.0.1 -p "$PORT" >"$RUN/moto.log" 2>&1 &
    echo $! >"$RUN/moto.pid"
    wait_port "$PORT" moto_server "$RUN/moto.log" "http://127.0.0.1:$PORT" ;;
stop)
    stop_pidfile "$RUN/moto.pid" ;;
*) echo "usage: $0 start [PORT] | stop" >&2; exit 2 ;;
esac
