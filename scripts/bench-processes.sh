#!/usr/bin/env bash
# Runs `narad bench --processes K --connections C` (K separate `narad serve` processes on one
# store, one partition, single-message requests) for K in {1,2,4,8,16} and C in {1,4}, and
# prints a Markdown table. Storage requests are summed over every process.
# Usage: scripts/bench-processes.sh STORE_URL [MESSAGES]
#   scripts/bench-processes.sh file:///tmp/narad-bench
#   scripts/bench-processes.sh s3://narad-test/bench      (after localstack/start.sh and the AWS_* exports)
#   NARAD_STORE_LATENCY_MS=20 scripts/bench-processes.sh s3://narad-test/bench   (S3-like latency)
set -euo pipefail
store="$1"
messages="${2:-300}"
bin="$(dirname "$0")/../target/release/narad"
[[ -x "$bin" ]] || bin="$(dirname "$0")/../target/debug/narad"
export NARAD_LOG=warn
# Per phase: msg/s, x serial CAS, storage requests per message (GET / PUT / LIST / failed
# conditional PUT, all), operations per commit, and $ per million messages at S3 Standard
# prices (SQS Standard: $0.40 per million requests, about $1.20 per message sent, received
# and deleted).
echo "| K x C | serial CAS/s | produce msg/s | x CAS | GET/PUT/LIST/412 per msg | req/msg | ops/commit | \$/M | consume+ack msg/s | x CAS | GET/PUT/LIST/412 per pair | req/pair | \$/M | errors |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
for c in 1 4; do
    for k in 1 2 4 8 16; do
        # A run with failed requests still prints its figures (and says so on stderr).
        out="$("$bin" bench --store "$store" --messages "$messages" --processes "$k" --connections "$c" --cas-ops 50 || true)"
        cas=$(sed -nE 's/^store serial CAS rate: ([0-9.]+).*/\1/p' <<<"$out")
        # phase msgs/s xCAS p50 p99 GET/msg PUT/msg 412/msg req/msg errors $/M LIST/msg ops/commit CPU
        read -r _ pr px _ _ pg pp pf pq pe pd pl po _ <<<"$(grep '^produce ' <<<"$out")"
        read -r _ cr cx _ _ cg cp cf cq ce cd cl _ _ <<<"$(grep '^consume+ack ' <<<"$out")"
        echo "| $k x $c | $cas | $pr | $px | $pg / $pp / $pl / $pf | $pq | $po | $pd | $cr | $cx | $cg / $cp / $cl / $cf | $cq | $cd | $pe + $ce |"
    done
done
