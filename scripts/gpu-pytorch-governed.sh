#!/usr/bin/env bash
# Governed clients (`gpushare run`) with PyTorch on a GPU machine. Runs from the folder that
# scripts/gpu-bundle.sh makes (gpushared, gpushare, libgpushare_interpose.so, governed/*.py);
# needs python3 with a CUDA build of torch, and no Rust toolchain.
#
#   (a) quota: a torch program allocating past its memory quota under `gpushare run` gets
#       torch.OutOfMemoryError, frees, and carries on.
#   (b) a high-priority inference loop (6 x Linear 2048 + GELU, batch 8, 2 ms think time;
#       p50/p99 latency) beside a best-effort training loop (same MLP, batch 512; it/s):
#       each alone, both plain (no broker), both governed under `scheduler = "priority"`
#       with a policy that grants `high` (the inference loop asks for it; the training loop
#       asks for best-effort). `gpushare status` is taken twice during the governed run, and
#       the interposer's diagnostics (GPUSHARE_INTERPOSE_DEBUG=1, on by default for this run:
#       set GPUSHARE_INTERPOSE_DEBUG=0 to turn them off) are printed after it.
#   (c) overhead: the training loop alone, plain vs governed (FIFO: never gated).
#
# Usage: ./gpu-pytorch-governed.sh [SECONDS_PER_RUN] (default 15). Prints a markdown summary
# and writes governed-results.json beside the script. Exit status: non-zero if a check failed.
set -uo pipefail
dir=$(cd "$(dirname "$0")" && pwd)
secs=${1:-15}
py=${PYTHON:-python3}
work=$(mktemp -d)
sock=$work/gpushare.sock
broker_pid=
failed=0
trap 'stop_broker; rm -rf "$work"' EXIT

for f in gpushared gpushare libgpushare_interpose.so governed/mlp.py governed/quota.py; do
    [[ -e $dir/$f ]] || { echo "missing $dir/$f: run scripts/gpu-bundle.sh and copy its folder" >&2; exit 2; }
done
"$py" -c 'import torch; assert torch.cuda.is_available()' ||
    { echo "python3 cannot use the GPU through torch" >&2; exit 2; }

# start_broker SCHEDULER [QUOTA [CLASS]]: a broker on the GPU with that policy, on a private
# socket; QUOTA "" for none; CLASS the class the policy grants everyone (default normal).
start_broker() {
    local policy=$work/policy.toml
    {
        echo "scheduler = \"$1\""
        echo "[defaults]"
        [[ -n ${2:-} ]] && echo "memory_quota = \"$2\""
        echo "class = \"${3:-normal}\""
    } > "$policy"
    "$dir/gpushared" --socket "$sock" --backend cuda --config "$policy" --no-telemetry \
        --log warn 2> "$work/broker.log" &
    broker_pid=$!
    for _ in $(seq 100); do
        "$dir/gpushare" --socket "$sock" status > /dev/null 2>&1 && return 0
        sleep 0.1
    done
    echo "gpushared did not start:" >&2; cat "$work/broker.log" >&2; exit 1
}

stop_broker() {
    if [[ -n $broker_pid ]]; then
        kill -TERM "$broker_pid" 2> /dev/null
        wait "$broker_pid" 2> /dev/null
        broker_pid=
    fi
}

governed() { # governed [gpushare run options] -- command...
    "$dir/gpushare" --socket "$sock" run --mode governed --interposer "$dir/libgpushare_interpose.so" "$@"
}

check() { # check NAME PYTHON_EXPRESSION_ON_r: prints and records a pass or failure
    if "$py" -c "import json,sys; r=json.load(open(sys.argv[1])); sys.exit(0 if ($2) else 1)" "$work/$1.json"; then
        echo "PASS $1: $2"
    else
        echo "FAIL $1: $2 — $(cat "$work/$1.json")"; failed=1
    fi
}

echo "## (a) quota"
start_broker fifo "2 GiB"
governed --name quota -- "$py" "$dir/governed/quota.py" --quota-gib 2 > "$work/quota.json" 2> "$work/quota.err"
cat "$work/quota.json"; grep -v '^$' "$work/quota.err" | tail -3
check quota 'r["oom"] and r["within_quota"] and r["allocated_before_oom_gib"] >= 1.0 and r["carried_on"]'
stop_broker

echo "## (b) high-priority inference beside best-effort training (${secs}s each run)"
mlp() { "$py" "$dir/governed/mlp.py" --seconds "$secs" "$@"; }
mlp --role hp > "$work/hp_alone.json"
mlp --role be > "$work/be_alone.json"
mlp --role hp > "$work/hp_plain.json" & hp=$!
mlp --role be > "$work/be_plain.json"; wait $hp
# The policy grants `high`: a program may ask for a less important class than its grant,
# never a more important one (the interposer warns if it is refused).
start_broker priority "" high
debug=${GPUSHARE_INTERPOSE_DEBUG-1}
GPUSHARE_INTERPOSE_DEBUG=$debug governed --class high --name infer -- "$py" "$dir/governed/mlp.py" --seconds "$secs" --role hp \
    > "$work/hp_governed.json" 2> "$work/hp_governed.err" & hp=$!
sleep 1
GPUSHARE_INTERPOSE_DEBUG=$debug governed --class best-effort --name train -- "$py" "$dir/governed/mlp.py" --seconds "$secs" --role be \
    > "$work/be_governed.json" 2> "$work/be_governed.err" & be=$!
sleep $((secs / 2 + 2))
echo "status, mid-run:"
"$dir/gpushare" --socket "$sock" status | tee "$work/status.txt"
"$dir/gpushare" --socket "$sock" status --json > "$work/status-mid.json"
sleep $((secs / 2 > 1 ? secs / 2 - 1 : 0))
echo "status, near the end:"
"$dir/gpushare" --socket "$sock" status | tee -a "$work/status.txt" | tail -n +2
"$dir/gpushare" --socket "$sock" status --json > "$work/status-late.json"
wait $hp $be
stop_broker
for side in hp be; do
    echo "-- stderr of the governed ${side} program (gpushare lines):"
    grep '^gpushare' "$work/${side}_governed.err" || echo "   (none)"
done
if [[ -s $work/broker.log ]]; then echo "-- broker log:"; tail -20 "$work/broker.log"; fi
"$py" - "$work/status-mid.json" "$work/status-late.json" <<'PYEOF'
import json, sys
for path in sys.argv[1:]:
    r = json.load(open(path))
    for c in r["clients"]:
        print(f"  {path.rsplit('/', 1)[-1]}: {c['name']}: class {c['class']}, commands {c['commands']}, "
              f"kernels {c['kernels']}, memory {c['memory_used'] / 2**20:.1f} MiB, "
              f"throttled {c['throttled_ns'] / 1e6:.1f} ms, queue {c['queue_depth']}")
PYEOF

echo "## (c) overhead of being governed, training alone"
start_broker fifo
governed --name train-alone -- "$py" "$dir/governed/mlp.py" --seconds "$secs" --role be > "$work/be_governed_alone.json"
stop_broker

"$py" - "$work" "$dir/governed-results.json" <<'EOF'
import json, sys
work, out = sys.argv[1], sys.argv[2]
names = ["quota", "hp_alone", "be_alone", "hp_plain", "be_plain", "hp_governed", "be_governed", "be_governed_alone"]
r = {n: json.load(open(f"{work}/{n}.json")) for n in names}
r["status"] = open(f"{work}/status.txt").read()
r["status_mid"] = json.load(open(f"{work}/status-mid.json"))
r["status_late"] = json.load(open(f"{work}/status-late.json"))
json.dump(r, open(out, "w"), indent=2)
f = lambda v: "-" if v is None else f"{v:.3f}"
print("\n| run | HP p50 ms | HP p99 ms | BE it/s |")
print("|---|---|---|---|")
print(f"| alone | {f(r['hp_alone']['p50_ms'])} | {f(r['hp_alone']['p99_ms'])} | {f(r['be_alone']['it_per_s'])} |")
print(f"| both, plain | {f(r['hp_plain']['p50_ms'])} | {f(r['hp_plain']['p99_ms'])} | {f(r['be_plain']['it_per_s'])} |")
print(f"| both, governed (priority) | {f(r['hp_governed']['p50_ms'])} | {f(r['hp_governed']['p99_ms'])} | {f(r['be_governed']['it_per_s'])} |")
print(f"\nHP p99 governed / plain: {r['hp_governed']['p99_ms'] / r['hp_plain']['p99_ms']:.2f}; "
      f"BE it/s governed / plain: {r['be_governed']['it_per_s'] / r['be_plain']['it_per_s']:.2f}")
print(f"(c) training alone, governed / plain it/s: {r['be_governed_alone']['it_per_s'] / r['be_alone']['it_per_s']:.3f}")
print(f"results: {out}")
EOF
check be_governed_alone 'r["iterations"] > 0'
# The governed run's late status: both programs governed, in the classes asked for, their
# launches counted.
cp "$work/status-late.json" "$work/status_late.json"
check status_late 'sorted((c["name"], c["class"]) for c in r["clients"]) == [("infer", "high"), ("train", "best-effort")] and all(c["governed"] and c["kernels"] > 0 for c in r["clients"])'
grep -q governed "$work/status.txt" && echo "PASS status lists governed clients" ||
    { echo "FAIL status does not list governed clients"; failed=1; }
exit $failed
