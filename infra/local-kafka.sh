#!/usr/bin/env bash
# A local Kafka-protocol broker for development and tests: tansu on 127.0.0.1 with SQLite storage.
#   infra/local-kafka.sh start [PORT]   # prints the bootstrap address; state under $QUARRY_RUN
#   infra/local-kafka.sh stop
# tansu advertises 127.0.0.1 (not localhost), as clients must reach exactly that address.
set -euo pipefail
# shellcheck source=infra/service-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/service-lib.sh"
TANSU="${QUARRY_TANSU:-$QUARRY_CACHE/tools/bin/tansu}"

launch() {
    rm -f "$RUN"/tansu.db*
    # tansu resolves a sqlite:// path against its working directory, so it runs in $RUN.
    cd "$RUN" && exec nohup "$TANSU" broker \
        --listener-url "tcp://127.0.0.1:$1" \
        --advertised-listener-url "tcp://127.0.0.1:$1" \
        --storage-engine "sqlite://tansu.db"
}

service_main tansu "$TANSU" 19092 "" "$@"
