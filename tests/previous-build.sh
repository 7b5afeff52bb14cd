#!/usr/bin/env bash
# Builds `narad` as of a pinned earlier commit of this repository, once, for the tests that
# run an older build beside this one (tests/tests/mixed_fleet.rs, the fixtures). Prints the
# binary's path. The source comes from this clone's git history (`git archive`), so no
# network is needed; the build goes to its own target directory and is kept there, keyed by
# commit, so later runs reuse it (about 8 minutes cold on 2 cores, nothing warm).
#
#   tests/previous-build.sh [COMMIT]     default: the build before the storage-format gate
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Main at this commit (2026-12-01) is "today's build" of issue 27: the last build that
# knows no gate, reads manifests up to format 5 and writes no process record.
commit="${1:-c3661c8b5c3fbc164d5ac1d54440f5f7ca7e0d6c}"
root="${CARGO_TARGET_DIR:-$PWD/target}/previous"
bin="$root/narad-${commit:0:12}"
if [[ -x "$bin" ]]; then
    echo "$bin"
    exit 0
fi
if ! git cat-file -e "$commit^{commit}" 2>/dev/null; then
    echo "previous-build: commit $commit is not in this clone's history; clone without --depth" >&2
    exit 1
fi
# One source directory for every commit, fresh each time, and one target directory beside
# it: dependencies that did not change are reused, and the workspace crates (same paths,
# newer files) are rebuilt. A directory per commit would share the target's fingerprints
# under different paths, and cargo would take one commit's build for another's.
src="$root/src"
rm -rf "$src"
mkdir -p "$src"
git archive "$commit" | tar -x -C "$src"
find "$src" -exec touch {} +
# No debug info, which nothing here needs and which doubles the link time.
CARGO_TARGET_DIR="$root/target" CARGO_PROFILE_DEV_DEBUG=0 \
    cargo build --manifest-path "$src/Cargo.toml" --locked -p narad --bin narad >&2
cp "$root/target/debug/narad" "$bin.tmp"
mv "$bin.tmp" "$bin"
echo "$bin"
