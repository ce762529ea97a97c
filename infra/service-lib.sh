# Shared by infra/local-kafka.sh and infra/local-s3.sh (sourced, not run): the cache and run
# folders, waiting for a loopback port, and stopping a service by its pid file.

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
