#!/usr/bin/env bash
# Fair shares across users for consolidated PyTorch training: two users' training loops (the
# transformer trainer of colocate/be.py, both consolidated through `gpushare run`) under
# `scheduler = "fair"` with user weights 2 : 1. gpushared measures each client's GPU time with
# events; the script reads it from `gpushare status --json` at the window's start and end and
# reports the ratio (goal: within 10 % of 2), with each trainer's iterations/s, and keeps
# `gpushare top -b` frames taken during the window (what an admin sees live).
#
# Runs from the folder scripts/gpu-bundle.sh makes (gpushared, gpushare, libcuda.so,
# libgpushare_audit.so, colocate/*.py), as root (the second user, USER2, default gpucolo, is
# created if missing). Settings: SECS (60), MODEL (transformer | mlp), PYTHON (python3),
# QUANTUM_US (0: the policy's `[fair] quantum_us`, turns of one kernel when 0), SHARE_SMS (set:
# `[fair] share_sms = true`, kernels side by side charged by SM·time), GRAPHS (set,
# with MODEL=mlp: each iteration of both trainers is one CUDA graph replay), SCHEDULER (fair,
# or priority: `scheduler = "priority"` with `[priority] lower_by_weight = true` and both
# trainers best-effort, the lower classes sharing by weight),
# LOGS (default $work/logs). Exit status: non-zero if the run failed or the ratio missed.
set -uo pipefail
dir=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-python3}
secs=${SECS:-60}
model=${MODEL:-transformer}
user2=${USER2:-gpucolo}
[[ $(id -u) == 0 ]] || { echo "needs root (to run the second trainer as $user2)" >&2; exit 2; }
id "$user2" > /dev/null 2>&1 || useradd -M -s /usr/sbin/nologin "$user2" ||
    { echo "cannot create user $user2" >&2; exit 2; }

work=$(mktemp -d /tmp/gpufair.XXXXXX)
chmod 1777 "$work" # the second user's trainer writes its ready and result files here
logs=${LOGS:-$work/logs}
mkdir -p "$logs"
broker_pid=
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2> /dev/null; done
    if [[ -n $broker_pid ]]; then kill "$broker_pid" 2> /dev/null; wait "$broker_pid" 2> /dev/null; fi
    rm -rf "${work:?}/bin" "${work:?}/py"
}
trap cleanup EXIT

mkdir -p "$work/bin/cuda" "$work/py"
cp "$dir"/colocate/*.py "$work/py/"
for f in gpushare libcuda.so libgpushare_audit.so; do cp "$dir/$f" "$work/bin/"; done
ln -s ../libcuda.so "$work/bin/cuda/libcuda.so.1"
ln -s ../libcuda.so "$work/bin/cuda/libcuda.so"
chmod -R a+rX "$work/py" "$work/bin"

sock=$work/gpushare.sock
scheduler=${SCHEDULER:-fair}
case $scheduler in
    fair) class=normal ;;
    priority) class=best-effort ;;
    *) echo "SCHEDULER is fair or priority, not $scheduler" >&2; exit 2 ;;
esac
cat > "$work/policy.toml" << EOF
scheduler = "$scheduler"
[priority]
lower_by_weight = true
[fair]
quantum_us = ${QUANTUM_US:-0}
share_sms = $([[ -n ${SHARE_SMS:-} ]] && echo true || echo false)
[defaults]
class = "$class"
[[users]]
uid = 0
weight = 2
[[users]]
name = "$user2"
weight = 1
EOF
cp "$work/policy.toml" "$logs/policy.toml"
timeout $((secs + 240)) "$dir/gpushared" --socket "$sock" --socket-mode 666 --backend "${BACKEND:-cuda}" \
    --config "$work/policy.toml" --no-telemetry --log info 2> "$logs/broker.log" &
broker_pid=$!
gs() { timeout 10 "$work/bin/gpushare" --socket "$sock" "$@"; }
for _ in $(seq 100); do gs status > /dev/null 2>&1 && break; sleep 0.1; done
gs status > /dev/null || { echo "gpushared did not start" >&2; cat "$logs/broker.log" >&2; exit 1; }

go=$work/go
start_trainer() { # start_trainer NAME [setpriv prefix...]
    local name=$1; shift
    (cd "$work" && timeout $((secs + 200)) "$@" env GPUSHARE_SOCKET="$sock" \
        "$work/bin/gpushare" run --name "$name" -- \
        "$py" "$work/py/be.py" --model "$model" --seconds "$secs" --ready "$work/$name.ready" \
        --go "$go" --out "$work/$name.json" --name "$name" ${GRAPHS:+--graph} \
        > "$logs/$name.out" 2> "$logs/$name.err") &
    pids+=($!)
}
start_trainer weight2
start_trainer weight1 setpriv --reuid "$user2" --regid "$user2" --init-groups env HOME=/tmp
for _ in $(seq 1200); do
    [[ -e $work/weight2.ready && -e $work/weight1.ready ]] && break
    for p in "${pids[@]}"; do
        kill -0 "$p" 2> /dev/null || { echo "a trainer exited before it was ready:" >&2; tail -n 5 "$logs"/*.err >&2; exit 1; }
    done
    sleep 0.1
done
if ! [[ -e $work/weight2.ready && -e $work/weight1.ready ]]; then
    echo "the trainers did not get ready in 120 s" >&2; tail -n 5 "$logs"/*.err >&2; exit 1
fi
python3 -c "import time; print(f'{time.time() + 0.5:.3f}')" > "$go.tmp" && mv "$go.tmp" "$go"
sleep 0.6
gs status --json > "$logs/status-start.json"
gs top -b -n 3 -d 5 > "$logs/top.txt" 2>&1 &
top_pid=$!
sleep "$secs"
gs status --json > "$logs/status-end.json"
for p in "${pids[@]}"; do wait "$p"; done
pids=()
wait "$top_pid"

python3 - "$logs" "$work" "$scheduler" << 'EOF'
import json, sys
logs, work = sys.argv[1], sys.argv[2]
a = {c["name"]: c for c in json.load(open(f"{logs}/status-start.json"))["clients"]}
b = {c["name"]: c for c in json.load(open(f"{logs}/status-end.json"))["clients"]}
gpu = {n: (b[n]["gpu_time_ns"] - a[n]["gpu_time_ns"]) / 1e9 for n in ("weight2", "weight1")}
its = {}
for n in ("weight2", "weight1"):
    try:
        its[n] = json.load(open(f"{work}/{n}.json"))["it_per_s"]
    except (OSError, ValueError, KeyError):
        its[n] = float("nan")
ratio = gpu["weight2"] / gpu["weight1"] if gpu["weight1"] else float("inf")
ok = abs(ratio - 2.0) <= 0.2
users = {n: b[n]["user"] for n in b}
print(f"{sys.argv[3] if len(sys.argv) > 3 else 'fair'}, weights 2:1 ({users.get('weight2')} : {users.get('weight1')}), window {b['weight2']['connected_ms'] / 1e3:.0f} s connected:")
print(f"  GPU time in the window: weight2 {gpu['weight2']:.2f} s, weight1 {gpu['weight1']:.2f} s; ratio {ratio:.3f} (goal 2 +- 10 %: {'met' if ok else 'MISSED'})")
print(f"  iterations/s: weight2 {its['weight2']:.1f}, weight1 {its['weight1']:.1f}; ratio {its['weight2'] / its['weight1']:.3f}")
sys.exit(0 if ok else 1)
EOF
rc=$?
echo "top frames during the window:"
cat "$logs/top.txt"
exit $rc
