#!/usr/bin/env bash
# Fuzzes the wire contract's decoders (client-lib/protocol/fuzz, cargo fuzz + libFuzzer) for a
# bounded time, starting from the checked-in corpus. Fails on the first crash, leaving the
# input in client-lib/protocol/fuzz/artifacts/<target>/.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]     (default: 20 s, every target)
#
# New corpus entries the fuzzer finds go to a temporary copy, never into the checked-in corpus.
# Needs cargo-fuzz (scripts/setup.sh installs it) and nightly Rust; without a nightly
# toolchain it uses stable with RUSTC_BOOTSTRAP=1 (the sanitizer flags are nightly-only).
set -euo pipefail
cd "$(dirname "$0")/../client-lib/protocol"

secs=${1:-20}
shift || true
targets=("$@")
((${#targets[@]})) || targets=(control_decode ring_entry shm_layout)
if ! [[ $secs =~ ^[1-9][0-9]*$ ]]; then
    echo "fuzz.sh: SECONDS_PER_TARGET must be a positive integer, not '$secs'" >&2
    exit 2
fi

log() { printf '\033[1m[fuzz]\033[0m %s\n' "$*"; }

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz.sh: cargo-fuzz is not installed; run scripts/setup.sh" >&2
    exit 1
fi
if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
    cargo=(cargo +nightly)
else
    log "no nightly toolchain: using stable with RUSTC_BOOTSTRAP=1"
    cargo=(env RUSTC_BOOTSTRAP=1 cargo)
fi

# libFuzzer's options: the time bound, a run-count guard should a machine be far faster than
# expected, a per-input timeout and a memory cap (a decoder that allocates what a length
# prefix claims fails here).
runs=$((secs * 1000000))
common=(-max_total_time="$secs" -runs="$runs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1)
max_len() {
    case $1 in
    ring_entry) echo 64 ;;   # one submission entry; the rest is ignored
    shm_layout) echo 512 ;;  # the header and 30 (offset, len) pairs
    *) echo 4096 ;;
    esac
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# cargo fuzz has no --locked: check the checked-in lockfile by hand before it builds.
"${cargo[@]}" metadata --locked --format-version 1 --manifest-path fuzz/Cargo.toml >/dev/null
log "building the fuzz targets"
"${cargo[@]}" fuzz build --fuzz-dir fuzz

for t in "${targets[@]}"; do
    if [[ ! -d fuzz/corpus/$t ]]; then
        echo "fuzz.sh: no target '$t' (no fuzz/corpus/$t)" >&2
        exit 2
    fi
    cp -r "fuzz/corpus/$t" "$work/$t"
    log "$t: ${secs} s from $(find "fuzz/corpus/$t" -type f | wc -l) corpus files"
    if ! "${cargo[@]}" fuzz run --fuzz-dir fuzz "$t" "$work/$t" -- \
        "${common[@]}" -max_len="$(max_len "$t")" >"$work/$t.log" 2>&1; then
        # The panic or sanitizer report, then where libFuzzer saved the input.
        sed -n '/panicked at\|ERROR: AddressSanitizer\|ERROR: LeakSanitizer\|ERROR: libFuzzer/,+12p' \
            "$work/$t.log" | head -n 40
        grep -E 'Test unit written|^Base64' "$work/$t.log" || tail -n 40 "$work/$t.log"
        echo "fuzz.sh: $t FAILED; the input is in client-lib/protocol/fuzz/artifacts/$t/." >&2
        echo "  reproduce: cd client-lib/protocol && cargo +nightly fuzz run --fuzz-dir fuzz $t <input>" >&2
        echo "  then add it to fuzz/corpus/$t/ as regress-<what> once fixed" >&2
        exit 1
    fi
    grep -E '^Done [0-9]+ runs' "$work/$t.log" || true
    sed -n 's/^stat::\(number_of_executed_units\|average_exec_per_sec\|new_units_added\|peak_rss_mb\): *\(.*\)$/  \1 \2/p' "$work/$t.log"
done
log "every target ran ${secs} s without a crash"
