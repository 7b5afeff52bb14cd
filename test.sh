#!/usr/bin/env bash
# Runs every Narad test on a fresh machine: formatting and lints, unit tests and the store
# conformance suite, the HTTP integration suite on the embedded file store, then LocalStack
# (installed and started by localstack/start.sh) and the whole suite again on S3, then the
# conformance suite and the whole suite on SeaweedFS (seaweedfs/start.sh), three processes
# on both stores through a fault proxy (tests/s3-faults.sh), schemathesis against narad serve
# (tests/schemathesis.sh), the web console in headless Chromium (tests/console.sh), the Python
# and TypeScript clients (tests/python-client.sh, tests/typescript-client.sh), then the narad-api
# Lambda function under cargo lambda watch on S3, cfn-lint on the SAM template, and the Worker
# (edge/) under wrangler dev with a local R2, the whole suite again against it.
#
# Every step runs even when an earlier one failed, so every suite reports. Each step prints
# how long it usually takes (on 2 cores, warm; see the README for cold times) and how long it
# took. The run ends with a list of the steps and one summary line; the exit status is
# non-zero when any step failed.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

# Every cargo test run is teed here so the end of this script can print one total.
results="$(mktemp)"
lambda_dir="$(mktemp -d)" edge_dir="$(mktemp -d)"
cleanup() {
    [[ -n "${LAMBDA_PORT:-}" ]] && functions/lambda-watch.sh stop >/dev/null 2>&1
    [[ -n "${EDGE_PORT:-}" ]] && edge/dev.sh stop >/dev/null 2>&1
    rm -rf "$results" "$lambda_dir" "$edge_dir"
}
trap cleanup EXIT

declare -a names=() outcomes=() seconds=()
failed=0

# step NAME USUAL COMMAND...: runs COMMAND as one step and records how it went.
step() {
    local name="$1" usual="$2"
    shift 2
    printf '\n== %s (usually %s)\n' "$name" "$usual"
    local start=$SECONDS
    "$@"
    local rc=$?
    local took=$((SECONDS - start))
    names+=("$name")
    seconds+=("$took")
    if [[ $rc -eq 0 ]]; then
        outcomes+=("ok")
        printf '== %s: ok in %d s\n' "$name" "$took"
    else
        outcomes+=("FAILED ($rc)")
        failed=$((failed + 1))
        printf '== %s: FAILED (exit %d) in %d s\n' "$name" "$rc" "$took"
    fi
}

# One compilation per profile: every cargo call selects the whole workspace, so features
# unify the same way each time and nothing is built twice.
tests() { cargo test --workspace --no-fail-fast "$@" 2>&1 | tee -a "$results"; }
# Every step after the file store's runs the suite again against another store or server;
# tests that make their own stores (the seeded fault runs, combining brokers, lost answers:
# tests/src/lib.rs, `skip_in_repeat`) test the same thing there and run in the first only.
tests_again() { NARAD_TEST_REPEAT=1 tests "$@"; }

export AWS_ENDPOINT_URL=http://127.0.0.1:4566 AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test
# Never let the AWS SDK look for instance metadata on this machine.
export AWS_REGION=us-east-1 AWS_EC2_METADATA_DISABLED=true
run_id="run-$(date +%s)-$$"

# A cold run fills about 6 GB (target/ with CARGO_INCREMENTAL=0 as .ci/run sets, and the
# tools); a full disk fails every later step with errors far from the cause, so say so first.
free_mb=$(df -Pm . | awk 'NR == 2 { print $4 }')
printf '== disk: %s MB free here\n' "$free_mb"
if [[ "$free_mb" =~ ^[0-9]+$ ]] && ((free_mb < 8000)); then
    printf '== WARNING: under 8 GB free; a cold run needs about 6 GB, so steps may fail for want of disk\n'
fi

step "formatting (cargo fmt --check)" "1 s" cargo fmt --all -- --check
step "lints (cargo clippy -D warnings)" "5 s warm; 9 min cold" cargo clippy --workspace --all-targets -- -D warnings
# The core without sockets, threads or the AWS SDK, as a Worker runs it (docs/design.md §9,
# "The runtime seam"): narad-shared with its default features off, for wasm32, lints included.
wasm_core() {
    if ! rustup target list --installed 2>/dev/null | grep -qx wasm32-unknown-unknown; then
        echo "== adding the wasm32-unknown-unknown target (rustup target add wasm32-unknown-unknown)"
        rustup target add wasm32-unknown-unknown || {
            echo "== the wasm32-unknown-unknown target cannot be added here: this step needs it" >&2
            return 1
        }
    fi
    cargo clippy -p narad-shared --target wasm32-unknown-unknown --no-default-features -- -D warnings
}
step "the core for wasm32 (cargo clippy -p narad-shared --target wasm32-unknown-unknown)" "5 s warm; 3 min cold" wasm_core
step "LocalStack S3 (localstack/start.sh)" "2 s; 1 min the first time" localstack/start.sh
# SeaweedFS's S3 gateway (seaweedfs/start.sh checks its ports are free), signed requests only.
sw_port=8333 sw_key=narad sw_secret=narad-seaweedfs-secret
step "SeaweedFS S3 (seaweedfs/start.sh)" "3 s; 16 s the first time" \
    env NARAD_SEAWEEDFS_PORT=$sw_port NARAD_SEAWEEDFS_ACCESS_KEY=$sw_key \
    NARAD_SEAWEEDFS_SECRET_KEY=$sw_secret seaweedfs/start.sh
step "build (workspace, all targets)" "5 s warm; 11 min cold" cargo build --workspace --all-targets
# narad serve of main at c3661c8, the build before the format gate, which the mixed-fleet
# test runs beside this one: built once from this clone's git history and kept in target/.
step "the previous build (main at c3661c8, for tests/tests/mixed_fleet.rs)" "1 s warm; 8 min cold" \
    tests/previous-build.sh
file_suite() { NARAD_TEST_S3="s3://narad-test/$run_id/conformance" tests; }
s3_suite() { NARAD_TEST_STORE="s3://narad-test/$run_id/http" tests_again; }
step "unit tests, store conformance (file, memory, S3), HTTP suite on the file store" "1 min" file_suite
step "the same tests with the HTTP suite on S3 (LocalStack)" "70 s" s3_suite
# Conformance (with 40 rounds of racing conditional writes) and the whole HTTP suite, on
# SeaweedFS: the second real S3 implementation, and the one self-hosting users run.
seaweedfs_suite() {
    local base="s3://narad-test/$run_id/seaweedfs"
    AWS_ENDPOINT_URL="http://127.0.0.1:$sw_port" AWS_ACCESS_KEY_ID="$sw_key" \
        AWS_SECRET_ACCESS_KEY="$sw_secret" NARAD_TEST_S3="$base/conformance" \
        NARAD_TEST_STORE="$base/http" tests_again
}
step "the same tests with conformance and the HTTP suite on SeaweedFS" "6 min (3 of them the races)" seaweedfs_suite
# Three `narad serve` processes on LocalStack, then on SeaweedFS, through a seeded fault proxy
# (lost answers after the store applied a write, 503 SlowDown, 500, resets, delays, and a
# writer's recovery read held while the others commit), 60 s each; then a drain, a replay of
# every offset and a check of the history (tests/s3-faults.sh; NARAD_S3_FAULT_SEED=N replays).
step "object-store faults (3 processes through a fault proxy, LocalStack and SeaweedFS)" "2.5 min" \
    env NARAD_SEAWEEDFS_PORT=$sw_port NARAD_SEAWEEDFS_ACCESS_KEY=$sw_key \
    NARAD_SEAWEEDFS_SECRET_KEY=$sw_secret tests/s3-faults.sh
# The OpenAPI document validated, and schemathesis against `narad serve` (tests/schemathesis.sh).
step "API fuzzing (schemathesis against narad serve)" "1 min; 1 min more the first time" tests/schemathesis.sh
# The web console in headless Chromium (tests/console.sh; installs chromium with apt if missing).
step "web console (Selenium, headless Chromium)" "30 s; 2 min more the first time" tests/console.sh
# The clients in clients/, each installed as a user installs it and tested against a fresh
# `narad serve`: worker loops, retries through a proxy answering 503, SIGTERM, and a check
# that their operations and types match /openapi.json.
step "Python client (pytest against narad serve)" "30 s; 1 min the first time" tests/python-client.sh
step "TypeScript client (node --test against narad serve)" "15 s; 1 min the first time" tests/typescript-client.sh

# The narad-api function, built by cargo-lambda and run by its Lambda runtime emulator
# (up to 8 instances, each a separate process sharing the bucket prefix), gets the whole
# HTTP suite. Tests share that one function, so they run one at a time; each starts by
# deleting every topic. Time is driven through NARAD_TEST_CLOCK_FILE.
tools_bin="$PWD/.tools/venv/bin"
step "Lambda tools (cargo-lambda, zig, cfn-lint)" "1 s; 30 s the first time" functions/lambda-watch.sh tools
lambda_build() {
    # The deployable build: arm64, cross-compiled with Zig. It needs Rust's aarch64 standard
    # library (cargo-lambda adds it to the rustup toolchain); where that cannot be had, the
    # x86_64 build stands in, so the size figure is still printed and the tests still run.
    local arch=arm64
    if ! PATH="$tools_bin:$PATH" cargo lambda build --release --arm64 --package narad-functions --bins; then
        echo "arm64 cross build unavailable on this machine; building x86_64 instead"
        arch=x86_64
        PATH="$tools_bin:$PATH" cargo lambda build --release --package narad-functions --bins || return 1
    fi
    for f in narad-api narad-maintenance; do
        printf '%s release %s binary: %s bytes\n' "$f" "$arch" "$(stat -c %s "target/lambda/$f/bootstrap")"
    done
    # The functions link no HTTP server (narad-shared's `server` feature: the accept loop,
    # the TLS acceptor) and one TLS stack, the S3 client's.
    local features tls
    features=$(cargo tree -p narad-functions -e features -i narad-shared --prefix none --format '{p} {f}' | sort -u)
    tls=$(cargo tree -p narad-functions -e normal --prefix none --format '{p}' | grep -E '^rustls v' | sed 's/ (\*)//' | sort -u)
    printf 'narad-shared features in the functions: %s\nTLS in the functions: %s\n' \
        "$(echo "$features" | grep '^narad-shared' | tr '\n' ' ')" "$(echo "$tls" | tr '\n' ' ')"
    if echo "$features" | grep -q 'narad-shared.*server'; then
        echo "the Lambda functions link narad-shared's server feature"
        return 1
    fi
    [[ $(echo "$tls" | wc -l) -eq 1 ]] || { echo "more than one rustls in the functions"; return 1; }
}
step "Lambda build (cargo lambda build --release)" "2 s warm; 7 min cold" lambda_build
lambda_suite() {
    LAMBDA_PORT="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
    export LAMBDA_PORT
    local store="s3://narad-test/$run_id/lambda"
    cat >"$lambda_dir/function.env" <<ENV
NARAD_STORE=$store
NARAD_AUTH=tester:s3cret-pass
NARAD_RECEIPT_KEY=test-receipt-key-0123456789
NARAD_POLL_INTERVAL_MS=50
NARAD_TEST_CLOCK_FILE=$lambda_dir/clock
NARAD_LOG=warn
ENV
    LAMBDA_ENV_FILE="$lambda_dir/function.env" functions/lambda-watch.sh start || return 1
    local rc=0
    NARAD_TEST_URL="http://127.0.0.1:$LAMBDA_PORT/lambda-url/narad-api" NARAD_TEST_STORE="$store" \
        NARAD_TEST_CLOCK_FILE="$lambda_dir/clock" NARAD_TEST_SERVER_ENV="$lambda_dir/function.env" \
        NARAD_TEST_SKIPS="$lambda_dir/skips" tests_again -- --test-threads=1 || rc=1
    printf 'tests that skipped themselves against the Lambda function: %d\n' \
        "$(cat "$lambda_dir/skips" 2>/dev/null | wc -l)"
    functions/lambda-watch.sh stop
    return $rc
}
step "Lambda runtime (cargo lambda watch) on S3" "1.5 min" lambda_suite
step "SAM template (cfn-lint infra/template.yaml)" "3 s" "$tools_bin/cfn-lint" infra/template.yaml

# The Worker (edge/, docs/edge.md): built from the registries alone (wasm-bindgen-cli and
# worker-build from crates.io, wrangler and esbuild from npm), run under `wrangler dev` with
# a local R2, and the same suite against it, as against the Lambda function.
edge_build() {
    cargo clippy -p narad-edge --target wasm32-unknown-unknown -- -D warnings || return 1
    cargo clippy -p narad-edge --target wasm32-unknown-unknown --features test-hooks -- -D warnings || return 1
    edge/dev.sh build
}
step "Worker build (edge/dev.sh build: worker-build, wasm-bindgen, wrangler)" "40 s warm; 6 min cold" edge_build
edge_suite() {
    EDGE_PORT="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
    export EDGE_PORT
    # R2's limit is one write per key per second; a local R2 does not enforce it, and the
    # broker spaces its writes by 100 ms here so that the pacing runs without making the
    # suite ten times slower (the benchmark runs the second: docs/benchmarks.md).
    cat >"$edge_dir/worker.env" <<ENV
NARAD_AUTH=tester:s3cret-pass
NARAD_RECEIPT_KEY=test-receipt-key-0123456789
NARAD_POLL_INTERVAL_MS=50
NARAD_LOG=warn
NARAD_R2_WRITE_INTERVAL_MS=100
ENV
    EDGE_ENV_FILE="$edge_dir/worker.env" EDGE_STATE="$edge_dir/state" edge/dev.sh start || return 1
    local rc=0 url="http://127.0.0.1:$EDGE_PORT"
    NARAD_TEST_URL="$url" NARAD_TEST_STORE="worker+$url" \
        NARAD_TEST_CLOCK_FILE="$edge_dir/clock" NARAD_TEST_SERVER_ENV="$edge_dir/worker.env" \
        NARAD_TEST_SKIPS="$edge_dir/skips" tests_again -- --test-threads=1 || rc=1
    printf 'tests that skipped themselves against the Worker: %d; against the Lambda function: %d\n' \
        "$(cat "$edge_dir/skips" 2>/dev/null | wc -l)" "$(cat "$lambda_dir/skips" 2>/dev/null | wc -l)"
    edge/dev.sh stop
    return $rc
}
step "Worker under wrangler dev, local R2" "3 min" edge_suite

printf '\n== summary\n'
for i in "${!names[@]}"; do
    printf '%-80s %6s s  %s\n' "${names[$i]}" "${seconds[$i]}" "${outcomes[$i]}"
done
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($i ~ /^passed/) p += $(i-1); if ($i ~ /^failed/) f += $(i-1) } }
     END { printf "tests: %d passed, %d failed", p, f }' "$results"
printf '; steps: %d of %d failed; total %d s\n' "$failed" "${#names[@]}" "$SECONDS"
for i in "${!names[@]}"; do
    [[ "${outcomes[$i]}" == ok ]] || printf 'failed step: %s\n' "${names[$i]}"
done
[[ $failed -eq 0 ]]
