#!/usr/bin/env bash
# Produce throughput and storage requests per message through a local Lambda runtime, in
# the two compute shapes infra/template.yaml offers (docs/lambda.md):
#   classic           cargo lambda watch, up to 8 instances, one invocation per instance
#   managed-instances functions/lmi-emulator.py: one environment, 32 invocations at once
# each with 1 and 32 concurrent clients sending single-message produces to a 1-partition
# topic on LocalStack. Storage requests are counted from LocalStack's own request log, so
# every instance is included; nothing else may use LocalStack meanwhile.
# Usage: functions/bench-lambda.sh [MESSAGES (600)]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
messages="${1:-600}"
log=localstack/data/localstack.log
localstack/start.sh >/dev/null
export AWS_ENDPOINT_URL=http://127.0.0.1:4566 AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test
export AWS_REGION=us-east-1 AWS_EC2_METADATA_DISABLED=true
work="$(mktemp -d)"
emu=""
cleanup() {
    [[ -n "$emu" ]] && kill "$emu" 2>/dev/null
    LAMBDA_PORT=9431 functions/lambda-watch.sh stop >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT

env_file() { # env_file NAME: the function's environment on a fresh prefix
    cat >"$work/$1.env" <<ENV
NARAD_STORE=s3://narad-test/bench-lambda-$1-$(date +%s)
NARAD_AUTH=bench:bench-secret
NARAD_LOG=warn
AWS_ENDPOINT_URL=$AWS_ENDPOINT_URL
AWS_ACCESS_KEY_ID=test
AWS_SECRET_ACCESS_KEY=test
AWS_REGION=us-east-1
AWS_EC2_METADATA_DISABLED=true
ENV
    echo "$work/$1.env"
}

fire() { # fire URL MESSAGES CONCURRENCY: prints msgs/s
    python3 - "$@" <<'PY'
import base64, sys, threading, time, urllib.request
url, n, conc = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
auth = "Basic " + base64.b64encode(b"bench:bench-secret").decode()
lock, left, errors = threading.Lock(), [n], [0]
def worker():
    while True:
        with lock:
            if left[0] == 0:
                return
            left[0] -= 1
        req = urllib.request.Request(url + "/v1/topics/bench/produce", data=b"hello",
                                     method="POST", headers={"Authorization": auth})
        try:
            urllib.request.urlopen(req, timeout=60).read()
        except Exception:
            with lock:
                errors[0] += 1
t0 = time.time()
threads = [threading.Thread(target=worker) for _ in range(conc)]
for t in threads: t.start()
for t in threads: t.join()
print(f"{n / (time.time() - t0):.1f} {errors[0]}")
PY
}

measure() { # measure SHAPE URL
    local shape="$1" url="$2"
    curl -sf -u bench:bench-secret -X PUT "$url/v1/topics/bench" -d '{"partitions":1}' >/dev/null
    fire "$url" 20 4 >/dev/null # warm every instance up
    for c in 1 32; do
        local before after rate errors reqs puts
        before=$(wc -l <"$log")
        read -r rate errors <<<"$(fire "$url" "$messages" "$c")"
        sleep 1
        after=$(wc -l <"$log")
        reqs=$(tail -n +"$((before + 1))" "$log" | head -n "$((after - before))" | grep -c 'AWS s3\.' || true)
        puts=$(tail -n +"$((before + 1))" "$log" | head -n "$((after - before))" | grep -c 'AWS s3\.PutObject' || true)
        printf '| %s | %d | %s | %s | %s | %s |\n' "$shape" "$c" "$rate" \
            "$(python3 -c "print(round($puts / $messages, 2))")" \
            "$(python3 -c "print(round($reqs / $messages, 2))")" "$errors"
    done
}

echo "| shape | concurrent clients | produce msg/s | PUT/msg | requests/msg | errors |"
echo "|---|---|---|---|---|---|"
LAMBDA_PORT=9431 LAMBDA_CONCURRENCY=8 LAMBDA_ENV_FILE="$(env_file classic)" \
    functions/lambda-watch.sh start >/dev/null 2>&1
measure "classic (8 instances)" "http://127.0.0.1:9431/lambda-url/narad-api"
LAMBDA_PORT=9431 functions/lambda-watch.sh stop >/dev/null 2>&1
functions/lmi-emulator.py --bin "${CARGO_TARGET_DIR:-target}/debug/narad-api" --port 9432 --concurrency 32 \
    --env-file "$(env_file lmi)" >"$work/lmi.log" 2>&1 &
emu=$!
for _ in $(seq 100); do curl -sf http://127.0.0.1:9432/health >/dev/null && break; sleep 0.1; done
measure "managed instances (1 environment x 32)" "http://127.0.0.1:9432"
