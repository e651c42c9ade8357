#!/usr/bin/env bash
# Runs gpushare's integration tests against the cuda backend, from a folder made by
# scripts/gpu-bundle.sh, on a GPU machine that has no Rust toolchain. GPU tests fail
# (instead of skipping) if no GPU broker can start. Exit status: non-zero if any test failed.
set -uo pipefail
dir=$(cd "$(dirname "$0")" && pwd)
export GPUSHARE_BIN_DIR=$dir GPUSHARE_TEST_BACKEND=cuda GPUSHARE_REQUIRE_GPU=1
status=0
for t in "$dir"/test-*; do
    name=${t##*/test-}
    case $name in
        c_abi|governed|run) echo "== $name: skipped (compiles C sources from the repo; run it where the repo is)"; continue ;;
    esac
    echo "== $name"
    "$t" --test-threads 2 "$@" || status=1
done
exit $status
