#!/usr/bin/env bash
# The main job: builds gpushare and runs its tour, `gpushare-demo tour` (tools/src/demo/tour.rs).
# A private broker, on the GPU when there is one and otherwise on the sim device in real time,
# serves an interactive client alone, then beside a best-effort trainer under FIFO, then under
# the priority policy; a table gives the interactive client's latency (p50, p99) and the
# trainer's throughput in each case. It also shows a quota refusal, a `gpushare top -b` frame
# with every client in it, and whether eBPF telemetry is on (and why not). Every result the
# clients compute is checked; the broker is stopped with SIGTERM and must exit cleanly.
#
#   scripts/demo.sh                  # arguments go to the tour: --backend sim, --seconds 3, …
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh

echo "[demo] building gpushared, the tools and the client library (release)"
cargo build --release --locked -p gpushare-broker -p gpushare-tools -p gpushare --quiet
exec target/release/gpushare-demo tour "$@"
