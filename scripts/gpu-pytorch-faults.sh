#!/usr/bin/env bash
# GPU faults beside unmodified PyTorch programs, on a GPU machine, as docs/reliability.md
# reports them. Runs from the folder scripts/gpu-bundle.sh makes (gpushared, gpushare,
# libcuda.so, libgpushare_audit.so, faults/*.py); needs python3 with a CUDA build of torch,
# root (it adds three Unix users), and no Rust toolchain.
#
#   storm: an inference loop (MLP, batch 8, think time between requests) and a trainer (MLP,
#     batch 512), each of its own Unix user, run consolidated in the default trust domain while
#     a third user's programs fault the GPU: FAULTS device-side asserts (cross_entropy with a
#     label out of range), then FAULTS illegal addresses, one program each, a pause between.
#     The victims check every answer bit for bit against the same request before the faults.
#   held memory: the inference loop holding 1, 10 and 100 GiB (HOLD_GIB) through three
#     illegal-address faults each: the time to its next correct result, and whether what it
#     held is intact; nvidia-smi's memory use and gpushared's own memory beside. Then again
#     with the spare mapping clients' memory only when it takes over, for TAKEOVER_GIB (100;
#     empty skips it).
#
# Usage: ./gpu-pytorch-faults.sh (FAULTS=10, PAUSE=1.5 s between faults). Logs go to $LOGS
# (default a temporary folder); prints markdown tables (faults/report.py). Exit status:
# non-zero if a victim saw a wrong result or its held memory changed.
set -uo pipefail
dir=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-python3}
faults=${FAULTS:-10}
pause=${PAUSE:-1.5}
hold=${HOLD_GIB:-1 10 100}
work=$(mktemp -d)
logs=${LOGS:-$work}
mkdir -p "$logs"
sock=$work/gpushare.sock
broker_pid=
trap 'stop_broker; rm -rf "$work"' EXIT

for f in gpushared gpushare libcuda.so libgpushare_audit.so faults/victims.py faults/culprit.py faults/report.py; do
    [[ -e $dir/$f ]] || { echo "missing $dir/$f: run scripts/gpu-bundle.sh and copy its folder" >&2; exit 2; }
done
for u in gsinfer gstrain gsculprit; do
    id -u "$u" > /dev/null 2>&1 || useradd --no-create-home --shell /usr/sbin/nologin "$u" || exit 2
done
chmod 755 "$work"
mkdir -p "$work/py" "$work/out" "$work/bin/cuda"
cp "$dir"/faults/*.py "$work/py/"
cp "$dir/gpushare" "$dir/libcuda.so" "$dir/libgpushare_audit.so" "$work/bin/"
ln -s ../libcuda.so "$work/bin/cuda/libcuda.so.1"
ln -s ../libcuda.so "$work/bin/cuda/libcuda.so"
chmod -R a+rX "$work/py" "$work/bin"
chmod 777 "$work/out"
cd "$work/py"

start_broker() { # start_broker [GPUSHARED-ARGS...]
    # One trust domain for everyone; the culprit's user is never refused for its faults here
    # (the storm is the point).
    printf '%s\n' 'scheduler = "fifo"' '[faults]' 'max_faults = 0' > "$work/policy.toml"
    "$dir/gpushared" --socket "$sock" --socket-mode 0666 --backend cuda --config "$work/policy.toml" \
        --no-telemetry --log info "$@" 2>> "$logs/broker.log" &
    broker_pid=$!
    for _ in $(seq 300); do
        "$dir/gpushare" --socket "$sock" status > /dev/null 2>&1 && return 0
        sleep 0.1
    done
    echo "gpushared did not start:" >&2; tail -20 "$logs/broker.log" >&2; exit 1
}

stop_broker() {
    if [[ -n $broker_pid ]]; then
        kill -TERM "$broker_pid" 2> /dev/null
        wait "$broker_pid" 2> /dev/null
        broker_pid=
    fi
}

# as USER CMD...: consolidated, as USER.
as() {
    local user=$1
    shift
    setpriv --reuid "$user" --regid "$user" --clear-groups env HOME=/tmp PYTHONUNBUFFERED=1 \
        "$work/bin/gpushare" --socket "$sock" run -- "$@"
}

# wait_ready FILE: until the program wrote its first line (it has its model and memory).
wait_ready() {
    for _ in $(seq 1200); do
        grep -q '"ready"' "$1" 2> /dev/null && return 0
        sleep 0.1
    done
    echo "$1 never got ready" >&2
    return 1
}

# fault KIND FILE: one culprit program; its line goes to FILE.
fault() {
    timeout 120 setpriv --reuid gsculprit --regid gsculprit --clear-groups env HOME=/tmp \
        "$work/bin/gpushare" --socket "$sock" run -- "$py" culprit.py "$1" >> "$2" 2>> "$logs/culprit.err"
    sleep "$pause"
}

memory() { # memory WHEN: the GPU's memory use and gpushared's, into memory.txt
    {
        echo "== $1"
        nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader
        nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader
        ps -o pid,rss,comm -p "$broker_pid,$(pgrep -d, -x gpushare-worker || true)" 2> /dev/null
    } >> "$logs/memory.txt"
}

start_broker
echo "## storm: $faults device-side asserts, then $faults illegal addresses"
stop=$work/out/stop
as gsinfer "$py" victims.py infer --stop "$stop" --think-ms 2 --out "$work/out/infer.jsonl" 2> "$logs/infer.err" &
infer_pid=$!
as gstrain "$py" victims.py train --stop "$stop" --out "$work/out/train.jsonl" 2> "$logs/train.err" &
train_pid=$!
wait_ready "$work/out/infer.jsonl" && wait_ready "$work/out/train.jsonl" || exit 1
sleep 3
memory "victims running, before the faults"
for kind in assert illegal; do
    for _ in $(seq "$faults"); do
        fault "$kind" "$work/out/faults.jsonl"
    done
done
sleep 2
touch "$stop"
wait "$infer_pid" "$train_pid"
rm -f "$stop"
cp "$work/out/infer.jsonl" "$work/out/train.jsonl" "$work/out/faults.jsonl" "$logs/"

held() { # held LABEL SIZES: the held-memory phase with the broker running now
    for gib in $2; do
        echo "## held memory: $gib GiB ($1)"
        local name=hold-$gib$1
        as gsinfer "$py" victims.py infer --stop "$stop" --think-ms 2 --hold-gib "$gib" \
            --out "$work/out/$name.jsonl" 2> "$logs/$name.err" &
        local pid=$!
        wait_ready "$work/out/$name.jsonl" || exit 1
        sleep 2
        memory "holding $gib GiB ($1)"
        for _ in 1 2 3; do
            fault illegal "$work/out/faults-$name.jsonl"
        done
        memory "holding $gib GiB ($1), after three faults"
        sleep 2
        touch "$stop"
        wait "$pid"
        rm -f "$stop"
        cp "$work/out/$name.jsonl" "$work/out/faults-$name.jsonl" "$logs/"
    done
}
held "" "$hold"
stop_broker
if [[ -n ${TAKEOVER_GIB-100} ]]; then
    start_broker --spare-maps-at-takeover
    held "-at-takeover" "${TAKEOVER_GIB-100}"
    stop_broker
fi

"$py" "$dir/faults/report.py" "$logs"
"$py" - "$logs" <<'PY'
import json, os, sys
logs = sys.argv[1]
bad = []
for name in os.listdir(logs):
    if not name.endswith(".jsonl") or name.startswith("faults"):
        continue
    for line in open(os.path.join(logs, name)):
        r = json.loads(line)
        if r.get("ok") and "correct" in r and not r["correct"]:
            bad.append(f"{name}: a wrong answer at {r['t']}")
        if r.get("done") and r.get("held_intact") is False:
            bad.append(f"{name}: the memory it held changed")
print("\n".join(bad) or "every answer checked was right, and every byte held was intact")
sys.exit(1 if bad else 0)
PY
