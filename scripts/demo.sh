#!/usr/bin/env bash
# The main job: builds gpushare, starts the broker (on the GPU when there is one, else on the
# sim device) and three demo clients of different priority classes that check their own
# results, shows the broker's status while they run, then stops everything.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh

echo "[demo] building (release)"
cargo build --release --locked --workspace --quiet
bin=target/release
work=$(mktemp -d)
socket="$work/gpushare.sock"
cat >"$work/policy.toml" <<POLICY
# Demo policy: this user may use every class; each demo client asks for its own.
[[users]]
uid = $(id -u)
class = "high"
memory_quota = "2 GiB"
POLICY

"$bin/gpushared" --socket "$socket" --backend auto --config "$work/policy.toml" \
    --socket-mode 600 --sim-realtime 2>"$work/gpushared.log" &
broker=$!
cleanup() {
    kill -TERM "$broker" 2>/dev/null || true
    wait "$broker" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
for _ in $(seq 100); do [[ -S $socket ]] && break; sleep 0.05; done
[[ -S $socket ]] || { cat "$work/gpushared.log"; echo "[demo] broker did not start" >&2; exit 1; }
export GPUSHARE_SOCKET=$socket
grep -m1 "gpushared ready" "$work/gpushared.log" | sed 's/\x1b\[[0-9;]*m//g' || true

echo "[demo] starting 3 clients: interactive (high), batch (normal), trainer (best-effort)"
"$bin/gpushare-demo" --name interactive --class high --workload vecadd --iterations 40 --size 65536 >"$work/hp.out" &
a=$!
"$bin/gpushare-demo" --name batch --class normal --workload mixed --iterations 30 >"$work/n.out" &
b=$!
"$bin/gpushare-demo" --name trainer --class best-effort --workload gemm --iterations 20 >"$work/be.out" &
c=$!
sleep 1
echo
"$bin/gpushare" status
echo
status=0
for pid in $a $b $c; do wait "$pid" || status=1; done
echo "[demo] summaries:"
cat "$work/hp.out" "$work/n.out" "$work/be.out"
kill -TERM "$broker"
wait "$broker" || true
if [[ -e $socket ]]; then echo "[demo] broker left its socket behind" >&2; status=1; fi
if ((status == 0)); then echo "[demo] all clients verified their results; broker stopped cleanly"; else echo "[demo] FAILED" >&2; fi
exit $status
