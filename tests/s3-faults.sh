#!/usr/bin/env bash
# The object-store fault test (tests/s3-faults/run.py): three `narad serve` processes share one
# bucket prefix through a seeded fault proxy (tests/s3-faults/proxy.py) that loses answers after
# the store applied a request, answers 503 SlowDown or 500, resets connections and delays
# requests (at NARAD_S3_FAULT_RATE, 6 % of storage requests by default), and holds a writer's
# recovery read after a lost conditional manifest or ledger write while the other processes
# commit. Then it drains, replays every offset and checks the history: nothing acknowledged
# lost, no acked message delivered again, no two live leases, no request stored twice, no
# landed ack answered 410, no 500. Once on LocalStack (127.0.0.1:4566), once on SeaweedFS
# (127.0.0.1:${NARAD_SEAWEEDFS_PORT:-8333}); both must be running (test.sh starts them first).
#
# Usage: tests/s3-faults.sh [run.py options]   (NARAD_BIN to test another build)
# Replay a seed: NARAD_S3_FAULT_SEED=N tests/s3-faults.sh (each run prints its seed; the
# SeaweedFS run uses N+1); the default is the fixed seed 99961761, `random` draws one.
# NARAD_S3_FAULT_SECONDS (60), NARAD_S3_FAULT_PROFILE (mixed; random or targeted),
# NARAD_S3_FAULT_STORES ("localstack seaweedfs").
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bin="${NARAD_BIN:-${CARGO_TARGET_DIR:-target}/debug/narad}"
[[ -x "$bin" ]] || { echo "[s3-faults] no $bin: build it first (cargo build)" >&2; exit 2; }
# A fixed seed by default, as the Rust fault suites use (tests/tests/faults.rs): the test run
# replays the same fault mix each time. NARAD_S3_FAULT_SEED=random draws a fresh one.
seed="${NARAD_S3_FAULT_SEED:-99961761}"
[[ "$seed" == random ]] && seed=$((RANDOM * 32768 + RANDOM + 1))
common=(--narad "$bin" --seconds "${NARAD_S3_FAULT_SECONDS:-60}" --rate "${NARAD_S3_FAULT_RATE:-0.06}"
    --profile "${NARAD_S3_FAULT_PROFILE:-mixed}")
echo "[s3-faults] seed $seed (replay: NARAD_S3_FAULT_SEED=$seed tests/s3-faults.sh)"

rc=0
for store in ${NARAD_S3_FAULT_STORES:-localstack seaweedfs}; do
    case "$store" in
    localstack)
        python3 tests/s3-faults/run.py "${common[@]}" --label localstack --seed "$seed" \
            --endpoint 127.0.0.1:4566 --access-key test --secret-key test "$@" || rc=1
        ;;
    seaweedfs)
        python3 tests/s3-faults/run.py "${common[@]}" --label seaweedfs --seed "$((seed + 1))" \
            --endpoint "127.0.0.1:${NARAD_SEAWEEDFS_PORT:-8333}" \
            --access-key "${NARAD_SEAWEEDFS_ACCESS_KEY:-narad}" \
            --secret-key "${NARAD_SEAWEEDFS_SECRET_KEY:-narad-seaweedfs-secret}" "$@" || rc=1
        ;;
    *)
        echo "[s3-faults] unknown store $store" >&2
        rc=2
        ;;
    esac
done
exit $rc
