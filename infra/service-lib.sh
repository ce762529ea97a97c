# Shared by infra/local-kafka.sh and infra/local-s3.sh (sourced, not run): the cache and run
# folders, and the start/stop command line of a local service on a loopback port.

QUARRY_CACHE="${QUARRY_CACHE:-$HOME/.cache/quarry}"
RUN="${QUARRY_RUN:-$QUARRY_CACHE/run}"
mkdir -p "$RUN"

# wait_port PORT WHAT LOG PRINT: up to 10 s for 127.0.0.1:PORT to accept, then prints PRINT;
# otherwise says where WHAT logged and fails.
wait_port() {
    local port="$1" what="$2" log="$3" print="$4"
    for _ in $(seq 1 100); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then echo "$print"; return 0; fi
        sleep 0.1
    done
    echo "$what did not start; see $log" >&2
    return 1
}

# stop_pidfile FILE: stops the process whose pid FILE holds, and removes FILE.
stop_pidfile() {
    if [[ -f "$1" ]]; then kill "$(cat "$1")" 2>/dev/null || true; rm -f "$1"; fi
}

# service_main NAME EXE DEFAULT_PORT PRINT_PREFIX COMMAND [PORT]: `start [PORT]` runs `launch PORT`
# (defined by the caller; it starts EXE in the background, logging to $RUN/NAME.log) after
# stopping an earlier one, records its pid in $RUN/NAME.pid and prints PRINT_PREFIX127.0.0.1:PORT
# once the port accepts; `stop` stops it.
service_main() {
    local name="$1" exe="$2" default_port="$3" prefix="$4"
    case "${5:-}" in
    start)
        local port="${6:-$default_port}"
        [[ -x "$exe" ]] || { echo "$name not found at $exe: run infra/setup-test.sh" >&2; exit 1; }
        stop_pidfile "$RUN/$name.pid"
        launch "$port" >"$RUN/$name.log" 2>&1 &
        echo $! >"$RUN/$name.pid"
        wait_port "$port" "$name" "$RUN/$name.log" "${prefix}127.0.0.1:$port" ;;
    stop)
        stop_pidfile "$RUN/$name.pid" ;;
    *) echo "usage: $0 start [PORT] | stop" >&2; exit 2 ;;
    esac
}
