#!/usr/bin/env bash
# The web console in a real headless browser: installs Debian's chromium and chromedriver
# (apt, when missing) and Selenium (tests/console/requirements.txt, into .tools/console-venv),
# starts `narad serve` on a fresh file store with two users (`console`, every right, from
# NARAD_AUTH; `reader`, only `consume` on console-demo, from a users file in NARAD_USERS), and
# runs tests/console/console_test.py: sign in, browse topics and peek messages, create a topic,
# watch its charts fill, pause, resume, purge, view and redrive dead letters, delete a topic,
# and check that the reader is offered none of that and gets 403s. Screenshots are kept in
# target/console-screenshots (see console_test.py; failure.png when it fails).
# Usage: tests/console.sh   (NARAD_BIN to test another build)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source tests/lib.sh
VENV=.tools/console-venv
REQS=tests/console/requirements.txt
bin="${NARAD_BIN:-${CARGO_TARGET_DIR:-target}/debug/narad}"
shots="$(realpath -m "${CARGO_TARGET_DIR:-target}")/console-screenshots"

if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
    echo "[console] installing chromium and chromium-driver with apt"
    sudo_=()
    [[ "$(id -u)" -eq 0 ]] || sudo_=(sudo)
    "${sudo_[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver >/dev/null ||
        { "${sudo_[@]}" apt-get update -q >/dev/null &&
            "${sudo_[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver >/dev/null; }
fi
venv_install "$VENV" "$REQS"

[[ -x "$bin" ]] || { echo "[console] no $bin: build it first (cargo build)" >&2; exit 2; }
reader_hash="$(echo reader-secret | "$bin" hash-password)"
users="{\"users\":[{\"name\":\"reader\",\"password_hash\":\"$reader_hash\",
  \"grants\":[{\"topics\":\"console-demo\",\"actions\":[\"consume\"]}]}]}"
NARAD_USERS="$users" serve_fresh "$bin" console:console-secret
rm -rf "$shots"
NARAD_URL="$base" NARAD_USER=console NARAD_PASS=console-secret \
    NARAD_LIMITED_USER=reader NARAD_LIMITED_PASS=reader-secret \
    NARAD_SCREENSHOTS="$shots" "$VENV/bin/python" tests/console/console_test.py
echo "[console] screenshots: $(ls "$shots" | paste -sd' ')  (in $shots)"
