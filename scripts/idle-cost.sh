#!/usr/bin/env bash
# What idle consumers cost in storage requests, counted from LocalStack's own request log.
#
# Starts LocalStack (localstack/start.sh) and one `narad serve` on it, creates a 4-partition
# topic, sends 8 messages through it and consumes them (so every manifest exists, as in a
# drained topic), then runs CONSUMERS shell loops of `consume?wait=10s` against it. After a
# 15 s warm-up it counts the S3 requests LocalStack logs for SECONDS seconds. Then it
# produces one message through a second `narad serve` on the same bucket and prints how long
# the idle consumers took to get it.
#
# Nothing else may use LocalStack meanwhile: its log does not say who sent a request.
# Usage: scripts/idle-cost.sh [SECONDS (60)] [CONSUMERS (1)]
#   NARAD_BIN=target/debug/narad scripts/idle-cost.sh 60 16   (another build of narad)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
seconds="${1:-60}"
consumers="${2:-1}"
bin="${NARAD_BIN:-${CARGO_TARGET_DIR:-target}/release/narad}"
[[ -x "$bin" ]] || { echo "build narad first: cargo build --release" >&2; exit 2; }
log=localstack/data/localstack.log

localstack/start.sh >/dev/null
export AWS_ENDPOINT_URL=http://127.0.0.1:4566 AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test
export AWS_REGION=us-east-1 AWS_EC2_METADATA_DISABLED=true
store="s3://narad-test/idle-cost-$(date +%s)-$$"
export NARAD_AUTH=idle:idle-cost-secret NARAD_LOG=warn
auth=(-u idle:idle-cost-secret)

work="$(mktemp -d)"
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

serve() { # serve PORT: a narad serve on the bucket at 127.0.0.1:PORT
    NARAD_STORE="$store" NARAD_LISTEN="127.0.0.1:$1" "$bin" serve >"$work/serve-$1.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 100); do
        curl -sf "http://127.0.0.1:$1/health" >/dev/null && return 0
        sleep 0.1
    done
    echo "narad serve on port $1 did not start:" >&2
    cat "$work/serve-$1.log" >&2
    exit 1
}
serve 18471
serve 18472
a=http://127.0.0.1:18471
b=http://127.0.0.1:18472

curl -sf "${auth[@]}" -X PUT "$a/v1/topics/idle" -H 'content-type: application/json' \
    -d '{"partitions":4}' >/dev/null
for i in $(seq 8); do curl -sf "${auth[@]}" -X POST "$a/v1/topics/idle/produce" -d "m$i" >/dev/null; done
for _ in $(seq 8); do
    handle="$(curl -sf "${auth[@]}" "$a/v1/topics/idle/consume" |
        sed -E 's/.*"receipt_handle":"([^"]+)".*/\1/')"
    curl -sf "${auth[@]}" -X POST "$a/v1/topics/idle/ack?receipt_handle=$handle" >/dev/null
done

for c in $(seq "$consumers"); do
    (
        while true; do
            out="$(curl -s "${auth[@]}" "$a/v1/topics/idle/consume?wait=10s")"
            if [[ -n "$out" ]]; then echo "$(date +%s.%N) $out" >>"$work/got-$c"; fi
        done
    ) &
    pids+=($!)
done

sleep 15
before=$(wc -l <"$log")
sleep "$seconds"
after=$(wc -l <"$log")
window() { tail -n +"$((before + 1))" "$log" | head -n "$((after - before))"; }
requests=$(window | grep -c 'AWS s3\.' || true)
kinds="$(window | grep -o 'AWS s3\.[A-Za-z0-9]*' | sort | uniq -c | tr -s ' ' | paste -sd, -)"
echo "idle: $consumers consumer(s), 4 partitions, $seconds s: $requests storage requests" \
    "($(python3 -c "print(round($requests * 60 / $seconds, 1))") per minute; $kinds)"

sent=$(date +%s.%N)
curl -sf "${auth[@]}" -X POST "$b/v1/topics/idle/produce" -d news >/dev/null
for _ in $(seq 200); do
    if cat "$work"/got-* 2>/dev/null | grep -q news; then break; fi
    sleep 0.05
done
got="$(cat "$work"/got-* 2>/dev/null | grep news | head -1 | cut -d' ' -f1)"
if [[ -z "$got" ]]; then
    echo "the message produced through the other process never reached an idle consumer" >&2
    exit 1
fi
echo "produced through another process, consumed after $(python3 -c "print(round($got - $sent, 2))") s"
