#!/usr/bin/env bash
# Runs `narad bench` over partitions x connections on one store and prints a Markdown table.
# Usage: scripts/bench-matrix.sh STORE_URL [MESSAGES]
#   scripts/bench-matrix.sh file:///tmp/narad-bench
#   scripts/bench-matrix.sh s3://narad-test/bench      (after localstack/start.sh and the AWS_* exports)
set -euo pipefail
store="$1"
messages="${2:-1000}"
bin="$(dirname "$0")/../target/release/narad"
[[ -x "$bin" ]] || bin="$(dirname "$0")/../target/debug/narad"
export NARAD_LOG=warn
echo "| partitions | connections | batch | produce msgs/s | x CAS | consume+ack msgs/s | x CAS | PUT/msg | GET/msg | 412/msg | \$/M msgs |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
run() {
    local p=$1 c=$2 b=$3
    out="$("$bin" bench --store "$store" --messages "$messages" --partitions "$p" --connections "$c" --batch "$b")"
    prod=$(awk '$1=="produce" {print $2, $3}' <<<"$out")
    cons=$(awk '$1=="consume+ack" {print $2, $3}' <<<"$out")
    e2e=$(grep '^end to end' <<<"$out" | sed -E 's/.*: ([0-9.]+) PUT\/msg, ([0-9.]+) GET\/msg, ([0-9.]+) failed PUT\/msg.*\$([0-9.]+) per.*/\1 \2 \3 \4/')
    read -r pr px <<<"$prod"; read -r cr cx <<<"$cons"; read -r put get fail usd <<<"$e2e"
    echo "| $p | $c | $b | $pr | $px | $cr | $cx | $put | $get | $fail | $usd |"
}
for p in 1 4 16; do
    for c in 1 8 32 128; do
        run "$p" "$c" 1
    done
done
run 1 32 100
run 4 32 100
