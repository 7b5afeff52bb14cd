#!/usr/bin/env bash
# Runs every Narad test on a fresh machine: formatting and lints, unit tests and the store
# conformance suite, the HTTP integration suite on the embedded file store, then LocalStack
# (installed and started by localstack/start.sh) and the whole suite again on S3.
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

step "summary"
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($i ~ /^passed/) p += $(i-1); if ($i ~ /^failed/) f += $(i-1) } }
     END { printf "tests: %d passed, %d failed\n", p, f }' "$results"
