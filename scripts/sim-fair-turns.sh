#!/usr/bin/env bash
# How busy `fair` keeps the device for programs made of many short kernels: one kernel in
# flight at a time (`[fair] quantum_us = 0`, the default) against turns of a quantum. Two
# consolidated programs (tests/c/cuda_standin.c `spin`, through gpushare's libcuda) each
# launch COUNT kernels of US µs on the sim device in real time (`--sim-realtime`: a kernel
# takes its modelled time on the wall clock), so the wall time both take against the
# kernels' own time is the device's busy fraction. Rounds alternate the settings.
#
# Settings: COUNT (10000), US (50), QUANTA ("0 1000", µs), ROUNDS (3), BIN (target/release).
# Needs a C compiler and a release build (`cargo build --release`).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=$(cd "${BIN:-$root/target/release}" && pwd)
count=${COUNT:-10000}
us=${US:-50}
quanta=${QUANTA:-0 1000}
rounds=${ROUNDS:-3}
for f in gpushared gpushare libcuda.so; do
    [[ -x $bin/$f || -f $bin/$f ]] || { echo "missing $bin/$f (cargo build --release)" >&2; exit 2; }
done
work=$(mktemp -d /tmp/gpushare-fair-turns.XXXXXX)
broker=
cleanup() {
    [[ -n $broker ]] && kill "$broker" 2> /dev/null && wait "$broker" 2> /dev/null
    rm -rf "$work"
}
trap cleanup EXIT
src=$root/tests/c
"${CC:-cc}" -std=gnu11 -O1 -pthread "$src/cuda_standin.c" "$src/cuda_standin_common.c" "$src/cuda_standin_memory.c" \
    "$src/cuda_standin_streams.c" -ldl -o "$work/standin"
cp "$bin/libcuda.so" "$work/libcuda.so.1"
kernels_s=$(awk -v n="$count" -v u="$us" 'BEGIN { printf "%.2f", 2 * n * u / 1e6 }')
echo "two programs of $count kernels of $us µs each ($kernels_s s of kernels), sim device in real time"
for round in $(seq "$rounds"); do
    for q in $quanta; do
        printf 'scheduler = "fair"\n[fair]\nquantum_us = %d\n' "$q" > "$work/policy.toml"
        "$bin/gpushared" --socket "$work/sock" --backend sim --sim-realtime \
            --config "$work/policy.toml" --no-telemetry > "$work/broker.log" 2>&1 &
        broker=$!
        for _ in $(seq 100); do
            "$bin/gpushare" --socket "$work/sock" status > /dev/null 2>&1 && break
            sleep 0.1
        done
        t0=$(date +%s.%N)
        pids=()
        for name in a b; do
            GPUSHARE_SOCKET=$work/sock GPUSHARE_TEST_LIBCUDA=$work/libcuda.so.1 \
                LD_LIBRARY_PATH=$work GPUSHARE_NAME=$name \
                timeout 300 "$work/standin" spin "$count" "$us" > "$work/$name.out" 2>&1 &
            pids+=($!)
        done
        ok=yes
        for p in "${pids[@]}"; do wait "$p" || ok=no; done
        t1=$(date +%s.%N)
        kill "$broker"; wait "$broker" 2> /dev/null || true
        broker=
        awk -v a="$t0" -v b="$t1" -v q="$q" -v k="$kernels_s" -v r="$round" -v ok="$ok" \
            'BEGIN { printf "round %d, quantum %5d µs: %.2f s, device busy %3.0f %%%s\n", r, q, b - a, 100 * k / (b - a), ok == "yes" ? "" : " (a program failed)" }'
    done
done
