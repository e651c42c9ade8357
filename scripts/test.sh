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
# Before the tests, so that cargo test's summary stays the last thing printed.
step "cargo fuzz (the wire decoders, 20 s a target: scripts/fuzz.sh)"
./scripts/fuzz.sh 20
step "cargo test"
cargo test --workspace --locked -- --test-threads 2
