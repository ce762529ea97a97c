#!/usr/bin/env bash
# A local Kafka-protocol broker for development and tests: tansu on 127.0.0.1 with SQLite storage.
#   infra/local-kafka.sh start [PORT]   # prints the bootstrap address; state under $QUARRY_RUN
#   infra/local-kafka.sh stop
# tansu advertises 127.0.0.1 (not localhost), as clients must reach exactly that address.
set -euo pipefail
# shellcheck source=infra/service-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/service-lib.sh"
TANSU="${QUARRY_TANSU:-$QUARRY_CACHE/tools/bin/tansu}"
case "${1:-}" in
start)
    PORT="${2:-19092}"
    [[ -x "$TANSU" ]] || { echo "tansu not found at $TANSU: run infra/setup-test.sh" >&2; exit 1; }
    "$0" stop >/dev/null 2>&1 || true
    rm -f "$RUN"/tansu.db*
    # tansu resolves a sqlite:// path against its working directory, so it runs in $RUN.
    (cd "$RUN" && exec nohup "$TANSU" broker \
        --listener-url "tcp://127.0.0.1:$PORT" \
        --advertised-listener-url "tcp://127.0.0.1:$PORT" \
        --storage-engine "sqlite://tansu.db" >"$RUN/tansu.log" 2>&1) &
    echo $! >"$RUN/tansu.pid"
    wait_port "$PORT" tansu "$RUN/tansu.log" "127.0.0.1:$PORT" ;;
stop)
    stop_pidfile "$RUN/tansu.pid" ;;
*) echo "usage: $0 start [PORT] | stop" >&2; exit 2 ;;
esac
