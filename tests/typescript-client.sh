#!/usr/bin/env bash
# The TypeScript client (clients/typescript, @narad/client) against a real server: `npm ci`
# (only when node_modules is missing or package-lock.json changed), `npm run build` (tsc: the
# library into dist/, the tests into dist-test/), then starts `narad serve` on a fresh file
# store and runs the compiled tests with `node --test`: round trips of every method, the
# example worker (redelivery, heartbeats), 503 ack retries through a proxy, SIGTERM, and the
# drift between src/openapi.ts and the server's /openapi.json.
# Installs Debian's nodejs and npm with apt when node is missing.
# Usage: tests/typescript-client.sh   (NARAD_BIN to test another build)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source tests/lib.sh
bin="${NARAD_BIN:-${CARGO_TARGET_DIR:-target}/debug/narad}"
dir=clients/typescript

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    echo "[typescript] installing nodejs and npm with apt"
    sudo_=()
    [[ "$(id -u)" -eq 0 ]] || sudo_=(sudo)
    "${sudo_[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q nodejs npm >/dev/null ||
        { "${sudo_[@]}" apt-get update -q >/dev/null &&
            "${sudo_[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q nodejs npm >/dev/null; }
fi
major="$(node -p 'process.versions.node.split(".")[0]')"
[[ "$major" -ge 18 ]] || { echo "[typescript] node 18 or newer is needed, found $(node --version)" >&2; exit 2; }
stamp="$dir/node_modules/.package-lock.sha256"
want="$(sha256sum "$dir/package-lock.json" | cut -d' ' -f1)"
if [[ ! -d "$dir/node_modules" || "$want" != "$(cat "$stamp" 2>/dev/null || true)" ]]; then
    echo "[typescript] npm ci"
    (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error)
    echo "$want" >"$stamp"
fi
(cd "$dir" && npm run --silent build)

serve_fresh "$bin" ts-client:ts-client-secret
echo "[typescript] testing against $base"
(cd "$dir" && NARAD_URL="$base" NARAD_USER=ts-client NARAD_PASS=ts-client-secret npm test --silent)
