#!/usr/bin/env bash
# Runs every gpushare check: formatting, lints, and the whole test suite (unit, integration
# with real broker and client processes, the C ABI test). Sets up what it needs first.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "cargo fmt --check"
cargo fmt --all --check
step "cargo clippy (all targets, warnings are errors)"
cargo clippy --workspace --all-targets --locked -- -D warnings
step "cargo build (binaries the integration tests start)"
cargo build --workspace --locked
step "cargo fuzz (the wire decoders, 20 s a target: scripts/fuzz.sh)"
./scripts/fuzz.sh 20
step "cargo test"
# Every test binary runs even after a failure (--no-fail-fast), so that the summary covers
# them all; it is the last line printed.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
cargo test --workspace --locked --no-fail-fast -- --test-threads 2 2>&1 | tee "$log" || status=$?
step "summary"
awk -f scripts/test-summary.awk "$log"
exit "$status"
