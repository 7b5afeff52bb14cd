# Shared by tests/schemathesis.sh and tests/console.sh (source it from the repository root).

# venv_install VENV REQS: a venv at VENV with the pinned REQS installed, again only when REQS
# changed.
venv_install() {
    local venv="$1" reqs="$2" stamp="$1/.requirements.sha256" want
    mkdir -p "$(dirname "$venv")"
    if [[ ! -x "$venv/bin/python" ]]; then
        "${PYTHON:-python3}" -m venv "$venv"
        rm -f "$stamp"
    fi
    want="$(sha256sum "$reqs" | cut -d' ' -f1)"
    if [[ "$want" != "$(cat "$stamp" 2>/dev/null || true)" ]]; then
        echo "[tests] installing $reqs from PyPI into $venv"
        "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$reqs"
        echo "$want" >"$stamp"
    fi
}

# serve_fresh BIN USER:PASS: starts `BIN serve` on a fresh file store on a free port and waits
# for /health. Sets $work (a temporary directory, removed on exit with the server stopped),
# $base (http://127.0.0.1:PORT) and $serve_log.
serve_fresh() {
    local bin="$1" auth="$2" port
    [[ -x "$bin" ]] || { echo "[tests] no $bin: build it first (cargo build)" >&2; exit 2; }
    work="$(mktemp -d)"
    serve_pid=""
    trap 'serve_stop' EXIT
    port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
    serve_log="$work/serve.log"
    NARAD_STORE="file://$work/data" NARAD_LISTEN="127.0.0.1:$port" NARAD_AUTH="$auth" \
        NARAD_LOG=warn "$bin" serve >"$serve_log" 2>&1 &
    serve_pid=$!
    base="http://127.0.0.1:$port"
    for _ in $(seq 100); do curl -sf "$base/health" >/dev/null && return 0; sleep 0.1; done
    echo "[tests] narad serve did not start:" >&2
    cat "$serve_log" >&2
    exit 1
}

serve_stop() {
    [[ -n "${serve_pid:-}" ]] && kill "$serve_pid" 2>/dev/null
    wait 2>/dev/null || true
    rm -rf "$work"
}
