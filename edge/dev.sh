#!/usr/bin/env bash
# The Worker under `wrangler dev` (workerd, with a local R2 and the Durable Objects), for
# the HTTP suite and for trying it locally.
#
#   edge/dev.sh build   # build the Worker with its test hooks (edge/build.sh --features test-hooks)
#   edge/dev.sh start   # start wrangler dev on 127.0.0.1:$EDGE_PORT, wait until it answers
#   edge/dev.sh stop    # stop it (same EDGE_PORT)
#
# `start` reads:
#   EDGE_PORT      port to listen on, default 8787
#   EDGE_ENV_FILE  KEY=VALUE file with the Worker's variables (NARAD_AUTH, …), passed as --var
#   EDGE_STATE     where the local R2 and the objects persist, default .wrangler/state-$EDGE_PORT
# The Worker's URL is then http://127.0.0.1:$EDGE_PORT; with the test hooks, its store is
# NARAD_TEST_STORE=worker+http://127.0.0.1:$EDGE_PORT (tests/src/worker_store.rs).
set -euo pipefail

EDGE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PORT="${EDGE_PORT:-8787}"
STATE="${EDGE_STATE:-$EDGE/.wrangler/state-$PORT}"
PIDFILE="$EDGE/.wrangler/dev-$PORT.pid"
LOG="$EDGE/.wrangler/dev-$PORT.log"

case "${1:-}" in
build)
    "$EDGE/build.sh" --features test-hooks
    ;;
start)
    mkdir -p "$EDGE/.wrangler" "$STATE"
    vars=()
    if [[ -n "${EDGE_ENV_FILE:-}" ]]; then
        while IFS='=' read -r k v; do
            [[ -z "$k" || "$k" == \#* ]] && continue
            vars+=(--var "$k:$v")
        done <"$EDGE_ENV_FILE"
    fi
    cd "$EDGE"
    # No metrics, no prompts; --local keeps every binding on this machine.
    WRANGLER_SEND_METRICS=false WRANGLER_SEND_ERROR_REPORTS=false CI=true \
        setsid node_modules/.bin/wrangler dev --local --ip 127.0.0.1 --port "$PORT" \
        --persist-to "$STATE" --show-interactive-dev-session=false "${vars[@]}" \
        >"$LOG" 2>&1 </dev/null &
    echo $! >"$PIDFILE"
    for _ in $(seq 1 120); do
        if curl -s -o /dev/null "http://127.0.0.1:$PORT/"; then
            echo "the Worker answers on http://127.0.0.1:$PORT (log: $LOG)"
            exit 0
        fi
        if ! kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
            echo "wrangler dev exited; its log:" >&2
            tail -40 "$LOG" >&2
            exit 1
        fi
        sleep 0.5
    done
    echo "wrangler dev did not answer within 60 s; its log:" >&2
    tail -40 "$LOG" >&2
    exit 1
    ;;
stop)
    if [[ -f "$PIDFILE" ]]; then
        # wrangler runs workerd as a child: stop the whole group.
        kill -- -"$(cat "$PIDFILE")" 2>/dev/null || true
        rm -f "$PIDFILE"
    fi
    ;;
*)
    echo "usage: edge/dev.sh build|start|stop" >&2
    exit 2
    ;;
esac
