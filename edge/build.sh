#!/usr/bin/env bash
# Builds the Worker into edge/build/ from the registries alone: wasm-bindgen-cli and
# worker-build from crates.io (installed once into ~/.cargo/bin), esbuild and wrangler
# from npm (edge/package.json). worker-build would download wasm-bindgen, esbuild and
# wasm-opt from other sites; the *_BIN variables point it at these instead, and wasm-opt
# is skipped (--no-opt). The installs are not --locked: wasm-bindgen-cli's lock names a
# webpki-roots release the registry no longer serves.
set -euo pipefail
cd "$(dirname "$0")"
WASM_BINDGEN_VERSION=0.2.130   # = Cargo.lock's wasm-bindgen: worker-build insists
WORKER_BUILD_VERSION=0.8.7     # = the worker crate's minor

rustup target list --installed 2>/dev/null | grep -qx wasm32-unknown-unknown \
  || rustup target add wasm32-unknown-unknown
if [ "$(wasm-bindgen --version 2>/dev/null)" != "wasm-bindgen $WASM_BINDGEN_VERSION" ]; then
  cargo install wasm-bindgen-cli --version "$WASM_BINDGEN_VERSION"
fi
if [ "$(worker-build --version 2>/dev/null)" != "$WORKER_BUILD_VERSION" ]; then
  cargo install worker-build --version "$WORKER_BUILD_VERSION"
fi
[ -x node_modules/.bin/wrangler ] || npm ci --no-audit --no-fund
WASM_BINDGEN_BIN="$(command -v wasm-bindgen)" \
ESBUILD_BIN="$PWD/node_modules/@esbuild/linux-x64/bin/esbuild" \
  worker-build --release --no-opt "$@"
