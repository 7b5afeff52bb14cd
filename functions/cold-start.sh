#!/usr/bin/env bash
# Measures narad-api's cold start: the time from exec'ing the function binary to the answer
# of its first request, through the Lambda runtime API of `cargo lambda watch
# --only-lambda-apis` (the emulator queues the invocation; the binary starts, initialises,
# fetches it and answers). Also prints the function's own init_ms (config, S3 client and
# startup probe, broker). Needs LocalStack (localstack/start.sh) and the AWS_* variables.
# With --only-lambda-apis the emulator serves one function, named `_`, at its root URL.
#
#   functions/cold-start.sh [BINARY] [RUNS]
#   BINARY: default target/lambda-x86_64/narad-api/bootstrap
#           (cargo lambda build --release --x86-64 --bin narad-api --lambda-dir target/lambda-x86_64)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${1:-$ROOT/target/lambda-x86_64/narad-api/bootstrap}"
RUNS="${2:-10}"
PORT="${COLD_START_PORT:-9140}"
STORE="${COLD_START_STORE:-s3://narad-test/cold-start}"
: "${AWS_REGION:?set AWS_REGION}" "${AWS_EC2_METADATA_DISABLED:?set AWS_EC2_METADATA_DISABLED=true}"
export PATH="$ROOT/.tools/venv/bin:$PATH"

work="$(mktemp -d)"
setsid cargo lambda watch --only-lambda-apis --invoke-address 127.0.0.1 --invoke-port "$PORT" \
    >"$work/emulator.log" 2>&1 </dev/null &
emulator=$!
trap 'kill -- -$emulator 2>/dev/null || true; rm -rf "$work"' EXIT
for _ in $(seq 100); do
    grep -q 'starting Runtime server' "$work/emulator.log" && break
    sleep 0.1
done

now_ms() { echo $(($(date +%s%N) / 1000000)); }
for i in $(seq "$RUNS"); do
    curl -s -m 30 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/health" \
        >"$work/status" &
    client=$!
    sleep 0.3 # the invocation is queued before the function exists
    t0=$(now_ms)
    AWS_LAMBDA_FUNCTION_VERSION=1 AWS_LAMBDA_FUNCTION_MEMORY_SIZE=256 \
        AWS_LAMBDA_RUNTIME_API="http://127.0.0.1:$PORT/.rt" AWS_LAMBDA_FUNCTION_NAME=_ \
        NARAD_STORE="$STORE" NARAD_AUTH=cold:start-password NARAD_RECEIPT_KEY=cold-start-key-0123456789 \
        "$BIN" >"$work/fn.log" 2>&1 &
    fn=$!
    wait "$client" || true
    t1=$(now_ms)
    kill "$fn" 2>/dev/null || true
    wait "$fn" 2>/dev/null || true
    [[ -n "${COLD_START_DEBUG:-}" ]] && cat "$work/fn.log" >&2
    init=$(grep -o '"init_ms":[0-9]*' "$work/fn.log" | cut -d: -f2)
    echo "run $i: status $(cat "$work/status"), exec to first response $((t1 - t0)) ms, init_ms ${init:-?}"
done
