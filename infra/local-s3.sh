#!/usr/bin/env bash
# A local S3 API for development and tests: moto_server on 127.0.0.1.
#   infra/local-s3.sh start [PORT]   # prints the endpoint URL
#   infra/local-s3.sh stop
# Clients: AWS_ENDPOINT=<url> AWS_ALLOW_HTTP=true AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test
# AWS_REGION=us-east-1.
set -euo pipefail
QUARRY_CACHE="${QUARRY_CACHE:-$HOME/.cache/quarry}"
RUN="${QUARRY_RUN:-$QUARRY_CACHE/run}"
VENV="${QUARRY_TESTVENV:-$QUARRY_CACHE/testvenv}"
mkdir -p "$RUN"
case "${1:-}" in
start)
    PORT="${2:-15000}"
    [[ -x "$VENV/bin/moto_server" ]] || { echo "moto_server not found in $VENV: run infra/setup-test.sh" >&2; exit 1; }
    "$0" stop >/dev/null 2>&1 || true
    nohup "$VENV/bin/moto_server" -H 127.0.0.1 -p "$PORT" >"$RUN/moto.log" 2>&1 &
    echo $! >"$RUN/moto.pid"
    for _ in $(seq 1 100); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then echo "http://127.0.0.1:$PORT"; exit 0; fi
        sleep 0.1
    done
    echo "moto_server did not start; see $RUN/moto.log" >&2; exit 1 ;;
stop)
    if [[ -f "$RUN/moto.pid" ]]; then kill "$(cat "$RUN/moto.pid")" 2>/dev/null || true; rm -f "$RUN/moto.pid"; fi ;;
*) echo "usage: $0 start [PORT] | stop" >&2; exit 2 ;;
esac
