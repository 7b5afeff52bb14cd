#!/usr/bin/env bash
# Stop the SeaweedFS started by start.sh (by its pid file). Idempotent. Its data stays in
# seaweedfs/data/store; remove that directory for an empty store next time.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PIDFILE="$HERE/data/weed.pid"

if [[ ! -f "$PIDFILE" ]]; then
    echo "[seaweedfs] not running (no pid file)" >&2
    exit 0
fi
pid="$(cat "$PIDFILE")"
if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; then
    echo "[seaweedfs] stopping pid $pid" >&2
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 20); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.5
    done
    if kill -0 "$pid" 2>/dev/null; then
        echo "[seaweedfs] pid $pid still alive after 10 s, sending SIGKILL" >&2
        kill -9 "$pid" 2>/dev/null || true
    fi
else
    echo "[seaweedfs] pid $pid not running" >&2
fi
rm -f "$PIDFILE"
