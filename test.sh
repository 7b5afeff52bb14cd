#!/usr/bin/env bash
# Runs every Narad test on a fresh machine: formatting and lints, unit tests and the store
# conformance suite, the HTTP integration suite on the embedded file store, then LocalStack
# (installed and started by localstack/start.sh) and the whole suite again on S3, then the
# narad-api Lambda function under cargo lambda watch on S3, and cfn-lint on the SAM template.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

step() { printf '\n== %s\n' "$*"; }

# Every cargo test run is teed here so the end of this script can print one total.
results="$(mktemp)"
trap 'rm -f "$results"' EXIT
tests() { cargo test "$@" 2>&1 | tee -a "$results"; }

step "formatting (cargo fmt --check)"
cargo fmt --all -- --check

step "lints (cargo clippy -D warnings)"
cargo clippy --workspace --all-targets -- -D warnings

step "LocalStack S3 (localstack/start.sh)"
localstack/start.sh >/dev/null
# Never let the AWS SDK look for instance metadata on this machine.
export AWS_ENDPOINT_URL=http://127.0.0.1:4566 AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test
export AWS_REGION=us-east-1 AWS_EC2_METADATA_DISABLED=true
run_id="run-$(date +%s)-$$"

step "build"
cargo build --workspace --bins

step "unit tests, store conformance (file, memory, S3), HTTP suite on the file store"
NARAD_TEST_S3="s3://narad-test/$run_id/conformance" tests --workspace

step "HTTP suite on S3 (LocalStack)"
NARAD_TEST_STORE="s3://narad-test/$run_id/http" tests -p narad-tests

step "Lambda runtime (cargo lambda watch) on S3"
# The narad-api function, built by cargo-lambda and run by its Lambda runtime emulator
# (up to 8 instances, each a separate process sharing the bucket prefix), gets the whole
# HTTP suite. Tests share that one function, so they run one at a time; each starts by
# deleting every topic. Time is driven through NARAD_TEST_CLOCK_FILE.
functions/lambda-watch.sh tools
tools_bin="$PWD/.tools/venv/bin"
# The deployable build: arm64, cross-compiled with Zig. It needs Rust's aarch64 standard
# library (cargo-lambda adds it with rustup); where that cannot be had, the x86_64 build
# stands in, so the size figure is still printed and the tests below still run.
arch=arm64
if ! PATH="$tools_bin:$PATH" cargo lambda build --release --arm64 --package narad-functions --bins; then
    echo "arm64 cross build unavailable on this machine; building x86_64 instead"
    arch=x86_64
    PATH="$tools_bin:$PATH" cargo lambda build --release --package narad-functions --bins
fi
for f in narad-api narad-maintenance; do
    printf '%s release %s binary: %s bytes\n' "$f" "$arch" "$(stat -c %s "target/lambda/$f/bootstrap")"
done
lambda_dir="$(mktemp -d)"
lambda_port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
export LAMBDA_PORT="$lambda_port"
trap 'functions/lambda-watch.sh stop; rm -rf "$lambda_dir"; rm -f "$results"' EXIT
lambda_store="s3://narad-test/$run_id/lambda"
cat >"$lambda_dir/function.env" <<ENV
NARAD_STORE=$lambda_store
NARAD_AUTH=tester:s3cret-pass
NARAD_RECEIPT_KEY=test-receipt-key-0123456789
NARAD_POLL_INTERVAL_MS=50
NARAD_TOPIC_CACHE_MS=0
NARAD_TEST_CLOCK_FILE=$lambda_dir/clock
NARAD_LOG=warn
ENV
LAMBDA_ENV_FILE="$lambda_dir/function.env" functions/lambda-watch.sh start
NARAD_TEST_URL="http://127.0.0.1:$lambda_port/lambda-url/narad-api" NARAD_TEST_STORE="$lambda_store" \
    NARAD_TEST_CLOCK_FILE="$lambda_dir/clock" NARAD_TEST_SERVER_ENV="$lambda_dir/function.env" \
    tests -p narad-tests -- --test-threads=1
functions/lambda-watch.sh stop

step "SAM template (cfn-lint infra/template.yaml)"
"$tools_bin/cfn-lint" infra/template.yaml && echo "cfn-lint: no errors"

step "summary"
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($i ~ /^passed/) p += $(i-1); if ($i ~ /^failed/) f += $(i-1) } }
     END { printf "tests: %d passed, %d failed\n", p, f }' "$results"
