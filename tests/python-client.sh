#!/usr/bin/env bash
# The Python client (clients/python) against a real server: makes the virtualenv
# .tools/python-client-venv with the pinned test tools (clients/python/requirements-test.txt),
# installs the client into it afresh (non-editable, so the installed package is what is
# tested), starts `narad serve` on a fresh file store and runs clients/python/tests with pytest.
# Usage: tests/python-client.sh [pytest args]   (NARAD_BIN to test another build)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source tests/lib.sh
VENV=.tools/python-client-venv
REQS=clients/python/requirements-test.txt
bin="${NARAD_BIN:-${CARGO_TARGET_DIR:-target}/debug/narad}"

venv_install "$VENV" "$REQS"
build="$(mktemp -d)"
trap 'rm -rf "$build"' EXIT
# Build from a copy, so that no build/ or *.egg-info is left in the source tree.
cp -r clients/python/. "$build/"
rm -rf "$build/build" "$build"/src/*.egg-info
"$VENV/bin/pip" install --quiet --disable-pip-version-check --no-deps --no-build-isolation \
    --force-reinstall "$build"
rm -rf "$build"
trap - EXIT

serve_fresh "$bin" python-client:python-client-secret
# Run from the tests folder, so that `import narad` finds the installed package, not src/.
cd clients/python/tests
PYTHONDONTWRITEBYTECODE=1 NARAD_URL="$base" NARAD_USER=python-client NARAD_PASS=python-client-secret \
    "../../../$VENV/bin/python" -m pytest -q -p no:cacheprovider "$@"
