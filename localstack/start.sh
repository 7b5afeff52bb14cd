#!/usr/bin/env bash
# Start a local S3 (LocalStack 4.8.1, no Docker) for Narad's S3 tests. Idempotent:
# - creates localstack/.venv with python3 if missing,
# - installs the pinned requirements only when the venv is new or requirements.txt changed,
# - starts LocalStack in the background unless its health endpoint already answers,
# - waits (up to 90 s) for S3 to be available,
# - creates the bucket $NARAD_TEST_BUCKET (default narad-test) if missing.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="$HERE/.venv"
DATA="$HERE/data"
REQS="$HERE/requirements.txt"
STAMP="$VENV/.requirements.sha256"
LOG="$DATA/localstack.log"
PIDFILE="$DATA/localstack.pid"
ENDPOINT="http://127.0.0.1:4566"
HEALTH="$ENDPOINT/_localstack/health"
BUCKET="${NARAD_TEST_BUCKET:-narad-test}"
PYTHON="${PYTHON:-python3}"

log() { echo "[localstack] $*" >&2; }

s3_ready() {
    curl -fs --max-time 2 "$HEALTH" 2>/dev/null | grep -Eq '"s3": *"(available|running)"'
}

# 1. venv + pinned dependencies.
if [[ ! -x "$VENV/bin/python" ]]; then
    log "creating venv at $VENV"
    "$PYTHON" -m venv "$VENV"
    rm -f "$STAMP"
fi
want="$(sha256sum "$REQS" | cut -d' ' -f1)"
have="$(cat "$STAMP" 2>/dev/null || true)"
if [[ "$want" != "$have" ]]; then
    log "installing pinned requirements (this takes a minute or two the first time)"
    "$VENV/bin/pip" install --quiet --no-deps -r "$REQS"
    echo "$want" >"$STAMP"
else
    log "requirements up to date"
fi

# 2. Start LocalStack unless something already answers on the health endpoint. One that
#    answers is reused only if it is the pinned version, and the log says whose it is.
mkdir -p "$DATA"
PINNED="$(sed -nE 's/^localstack-core==([0-9.]+).*/\1/p' "$REQS")"
if health="$(curl -fs --max-time 2 "$HEALTH" 2>/dev/null)"; then
    running="$(printf '%s' "$health" | "$VENV/bin/python" -c 'import json, sys; print(json.load(sys.stdin).get("version", "unknown"))' 2>/dev/null || echo unknown)"
    if [[ -n "$PINNED" && "$running" != "$PINNED" ]]; then
        log "something else answers at $ENDPOINT: LocalStack $running, not the pinned $PINNED."
        log "stop it (or free port 4566) and run this again."
        exit 1
    fi
    if [[ -f "$PIDFILE" ]] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
        log "reusing LocalStack $running that this script started earlier (pid $(cat "$PIDFILE"), log $LOG)"
    else
        log "reusing LocalStack $running already answering at $ENDPOINT, started by someone else:"
        log "its state is shared with whatever else uses it (tests use their own key prefixes)"
    fi
else
    log "starting LocalStack (log: $LOG)"
    # SKIP_SSL_CERT_DOWNLOAD / DISABLE_EVENTS: no outbound calls (only registries are reachable).
    SERVICES=s3 GATEWAY_LISTEN=127.0.0.1:4566 DNS_DISABLED=1 \
        LOCALSTACK_VOLUME_DIR="$DATA" SKIP_SSL_CERT_DOWNLOAD=1 DISABLE_EVENTS=1 \
        nohup setsid "$VENV/bin/python" -m localstack.runtime.main >>"$LOG" 2>&1 </dev/null &
    echo $! >"$PIDFILE"
fi

# 3. Wait for S3.
deadline=$((SECONDS + 90))
until s3_ready; do
    if [[ -f "$PIDFILE" ]] && ! kill -0 "$(cat "$PIDFILE")" 2>/dev/null \
        && ! curl -fs --max-time 2 "$HEALTH" >/dev/null 2>&1; then
        log "LocalStack exited during startup; last log lines:"
        tail -n 40 "$LOG" >&2 || true
        rm -f "$PIDFILE"
        exit 1
    fi
    if ((SECONDS >= deadline)); then
        log "S3 not available after 90 s; last log lines:"
        tail -n 40 "$LOG" >&2 || true
        exit 1
    fi
    sleep 1
done
log "S3 is up at $ENDPOINT"

# 4. Create the test bucket if missing (boto3 from the venv, no aws CLI needed).
"$VENV/bin/python" - "$ENDPOINT" "$BUCKET" <<'PY'
import sys

import boto3
from botocore.exceptions import ClientError

endpoint, bucket = sys.argv[1], sys.argv[2]
s3 = boto3.client(
    "s3",
    endpoint_url=endpoint,
    aws_access_key_id="test",
    aws_secret_access_key="test",
    region_name="us-east-1",
)
try:
    s3.head_bucket(Bucket=bucket)
    print(f"[localstack] bucket {bucket} exists", file=sys.stderr)
except ClientError:
    s3.create_bucket(Bucket=bucket)
    print(f"[localstack] created bucket {bucket}", file=sys.stderr)
PY

cat <<ENV
# LocalStack S3 is ready. Export:
export AWS_ENDPOINT_URL=$ENDPOINT
export AWS_ACCESS_KEY_ID=test
export AWS_SECRET_ACCESS_KEY=test
export AWS_REGION=us-east-1
export NARAD_TEST_S3=s3://$BUCKET/ci
ENV
