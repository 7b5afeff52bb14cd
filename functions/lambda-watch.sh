#!/usr/bin/env bash
# The narad-api function under `cargo lambda watch` (the Lambda runtime emulator), for the
# HTTP suite and for trying the function locally.
#
#   functions/lambda-watch.sh tools   # only install the pinned tools (cargo-lambda, zig, cfn-lint)
#   functions/lambda-watch.sh start   # install if needed, start the emulator, wait until it answers
#   functions/lambda-watch.sh stop    # stop the emulator and its function instances (same LAMBDA_PORT)
#
# Idempotent, like localstack/start.sh: the tools go into .tools/venv from PyPI, and are
# reinstalled only when functions/requirements.txt changes. `start` reads:
#   LAMBDA_PORT      port to listen on (127.0.0.1), default 9000
#   LAMBDA_ENV_FILE  KEY=VALUE file with the function's environment (NARAD_STORE, NARAD_AUTH, …)
#   LAMBDA_CONCURRENCY  instances of the function at most, default 8
#   LAMBDA_RELEASE   1: build the function in release mode (for measuring; default debug)
# The function's URL is then http://127.0.0.1:$LAMBDA_PORT/lambda-url/narad-api.
# The AWS_* variables of the caller reach the function (set AWS_REGION and
# AWS_EC2_METADATA_DISABLED=true so the SDK never looks for instance metadata).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS="$ROOT/.tools"
VENV="$TOOLS/venv"
REQS="$ROOT/functions/requirements.txt"
STAMP="$VENV/.requirements.sha256"
PORT="${LAMBDA_PORT:-9000}"
# One emulator per port, so two test runs on one machine do not stop each other's.
PIDFILE="$TOOLS/lambda-watch-$PORT.pid"
LOG="$TOOLS/lambda-watch-$PORT.log"
CONCURRENCY="${LAMBDA_CONCURRENCY:-8}"
PYTHON="${PYTHON:-python3}"

log() { echo "[lambda-watch] $*" >&2; }

tools() {
    mkdir -p "$TOOLS"
    if [[ ! -x "$VENV/bin/python" ]]; then
        log "creating venv at $VENV"
        "$PYTHON" -m venv "$VENV"
        rm -f "$STAMP"
    fi
    local want have
    want="$(sha256sum "$REQS" | cut -d' ' -f1)"
    have="$(cat "$STAMP" 2>/dev/null || true)"
    if [[ "$want" != "$have" ]]; then
        log "installing cargo-lambda, ziglang and cfn-lint from PyPI"
        "$VENV/bin/pip" install --quiet --disable-pip-version-check -r "$REQS"
        echo "$want" >"$STAMP"
    fi
}

stop() {
    [[ -f "$PIDFILE" ]] || return 0
    local pid
    pid="$(cat "$PIDFILE")"
    # The emulator runs in its own process group (setsid): end it and its instances.
    kill -- "-$pid" 2>/dev/null || true
    for _ in $(seq 50); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -9 -- "-$pid" 2>/dev/null || true
    rm -f "$PIDFILE"
    log "stopped"
}

start() {
    tools
    stop
    export PATH="$VENV/bin:$PATH"
    local env_args=()
    if [[ -n "${LAMBDA_ENV_FILE:-}" ]]; then
        env_args=(--env-file "$LAMBDA_ENV_FILE")
    fi
    if [[ "${LAMBDA_RELEASE:-}" == 1 ]]; then
        env_args+=(--release)
    fi
    log "starting cargo lambda watch on 127.0.0.1:$PORT (log: $LOG)"
    cd "$ROOT"
    nohup setsid cargo lambda watch --ignore-changes --quiet \
        --concurrency "$CONCURRENCY" \
        --invoke-address 127.0.0.1 --invoke-port "$PORT" \
        --bin narad-api "${env_args[@]}" >"$LOG" 2>&1 </dev/null &
    echo $! >"$PIDFILE"
    # The first request builds and starts the function (`cargo run`), so allow time.
    local url="http://127.0.0.1:$PORT/lambda-url/narad-api/health" deadline=$((SECONDS + 900))
    until curl -fs --max-time 120 "$url" >/dev/null 2>&1; do
        if ! kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
            log "cargo lambda watch exited; last log lines:"
            tail -n 40 "$LOG" >&2 || true
            rm -f "$PIDFILE"
            exit 1
        fi
        if ((SECONDS >= deadline)); then
            log "the function did not answer within 900 s; last log lines:"
            tail -n 40 "$LOG" >&2 || true
            stop
            exit 1
        fi
        sleep 1
    done
    log "narad-api answers at http://127.0.0.1:$PORT/lambda-url/narad-api"
}

case "${1:-}" in
tools) tools ;;
start) start ;;
stop) stop ;;
*)
    echo "usage: $0 tools|start|stop" >&2
    exit 2
    ;;
esac
