#!/usr/bin/env bash
# Stop the LocalStack started by start.sh (by its pid file). Idempotent.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PIDFILE="$HERE/data/localstack.pid"

if [[ ! -f "$PIDFILE" ]]; then
    echo "[localstack] not running (no pid file)" >&2
    exit 0
fi
pid="$(cat "$PIDFILE")"
if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; then
    echo "[localstack] stopping pid $pid" >&2
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 20); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.5
    done
    if kill -0 "$pid" 2>/dev/null; then
        echo "[localstack] pid $pid still alive after 10 s, sending SIGKILL" >&2
        kill -9 "$pid" 2>/dev/null || true
    fi
else
    echo "[localstack] pid $pid not running" >&2
fi
rm -f "$PIDFILE"
