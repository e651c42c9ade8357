#!/usr/bin/env bash
# Several GPUs on real hardware (issue 32, points 1 and 5), from the folder scripts/gpu-bundle.sh
# makes; needs python3 with a CUDA build of torch, and at least two GPUs.
#
# 1. NVML and CUDA agree under `gpushare run`, with no CUDA_VISIBLE_DEVICES: for the default
#    placement and for each `--gpu N`, PyTorch's device count, the UUID of its device 0 and what
#    NVML (through ctypes, as PyTorch reaches it, and nvidia-smi -L) lists inside the program,
#    and the device address of its first tensor (each GPU's memory lies at addresses of its own).
# 2. Placement under load: a trainer started with no GPU named, then a second once the first
#    keeps its GPU busy: the second goes to another GPU (each `-v` line says where and why).
# 3. Per-GPU colocation: on every GPU at once, a high-priority inference loop (colocate/hp.py,
#    mlp) beside a best-effort trainer (colocate/be.py, mlp), against the loop alone on a GPU
#    of its own run directly; p50/p99 per GPU.
# 4. Faults stay on their GPU: an inference loop (faults/victims.py) on each GPU, one user and
#    one trust domain, while programs on GPU 0 fault it (FAULTS device-side asserts, then as
#    many illegal addresses): every answer is checked bit for bit; the loop on GPU 1 should
#    not notice, the one on GPU 0 should get its answers right after each fault.
# Settings: SECS (10, the measured window), FAULTS (3), LOGS (default $work/logs), PYTHON (python3).
# Keep NVLink multicast off in everything run here (NCCL_NVLS_ENABLE=0 is set).
set -uo pipefail
dir=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-python3}
secs=${SECS:-10}
export NCCL_NVLS_ENABLE=0
work=$(mktemp -d /tmp/gpumulti.XXXXXX)
logs=${LOGS:-$work/logs}
mkdir -p "$logs"
pids=()
broker_pid=
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2> /dev/null; done
    if [[ -n $broker_pid ]]; then kill "$broker_pid" 2> /dev/null; wait "$broker_pid" 2> /dev/null; fi
}
trap cleanup EXIT

gpus=$(nvidia-smi -L | grep -c '^GPU ')
nvidia-smi -L > "$logs/smi-direct.txt"
[[ $gpus -ge 2 ]] || { echo "needs at least two GPUs (nvidia-smi lists $gpus)" >&2; exit 2; }

sock=$work/gpushare.sock
printf 'scheduler = "priority"\n[defaults]\nclass = "high"\n' > "$work/policy.toml"
timeout $((secs * 4 + 400)) "$dir/gpushared" --socket "$sock" --backend cuda --gpu all \
    --config "$work/policy.toml" --no-telemetry 2> "$logs/gpushared.log" &
broker_pid=$!
for _ in $(seq 1 200); do [[ -S $sock ]] && break; sleep 0.1; done
[[ -S $sock ]] || { echo "gpushared did not start (see $logs/gpushared.log)" >&2; exit 1; }
export GPUSHARE_SOCKET=$sock
gs() { timeout 60 "$dir/gpushare" "$@"; }

# 1. What a program sees.
probe='
import ctypes, json, torch
nvml = ctypes.CDLL("libnvidia-ml.so.1")
nvml.nvmlInit_v2()
n = ctypes.c_uint(0)
nvml.nvmlDeviceGetCount_v2(ctypes.byref(n))
uuids = []
for i in range(n.value):
    h = ctypes.c_void_p()
    buf = ctypes.create_string_buffer(96)
    nvml.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(h))
    nvml.nvmlDeviceGetUUID(h, buf, 96)
    uuids.append(buf.value.decode())
count = torch.cuda.device_count()
uuid = "GPU-" + str(torch.cuda.get_device_properties(0).uuid) if count else None
x = torch.arange(1000, device="cuda", dtype=torch.float32)
print(json.dumps({"torch_devices": count, "torch_uuid": uuid, "nvml": uuids, "sum": float(x.sum()), "address": hex(x.data_ptr())}))
'
{
    for ask in "" "--gpu 0" "--gpu 1"; do
        echo "== gpushare run -v $ask"
        # shellcheck disable=SC2086
        gs run -v $ask -- "$py" -c "$probe" 2>&1
        # shellcheck disable=SC2086
        gs run $ask -- nvidia-smi -L 2>&1
    done
} > "$logs/agree.txt"

# 2. Placement under load.
start_be() { # NAME [run args...]
    local name=$1
    shift
    gs run -v --class best-effort "$@" -- "$py" "$dir/colocate/be.py" --model mlp \
        --seconds "$secs" --ready "$work/$name.ready" --go "$work/go" \
        --out "$logs/$name.json" --name "$name" 2> "$logs/$name.err" &
    pids+=($!)
}
start_hp() { # NAME [run args...]
    local name=$1
    shift
    "$@" "$py" "$dir/colocate/hp.py" --model mlp --seconds "$secs" --ready "$work/$name.ready" \
        --go "$work/go" --out "$logs/$name.json" --name "$name" 2> "$logs/$name.err" &
    pids+=($!)
}
wait_ready() { # NAMES...
    for _ in $(seq 1 1200); do
        local all=1
        for n in "$@"; do [[ -e $work/$n.ready ]] || all=0; done
        [[ $all == 1 ]] && return 0
        sleep 0.1
    done
    echo "not ready: $*" >&2
    return 1
}
go() { python3 -c 'import time; print(time.time() + 0.5)' > "$work/go"; }
finish() {
    for p in "${pids[@]}"; do wait "$p"; done
    pids=()
    rm -f "$work/go" "$work"/*.ready
}

start_be first
wait_ready first
sleep 3 # its GPU time shows in gpushared's measured load
gs status > "$logs/status-one-trainer.txt" 2>&1
start_be second
wait_ready second
gs status > "$logs/status-two-trainers.txt" 2>&1
go
finish
grep -h "running on GPU" "$logs/first.err" "$logs/second.err" > "$logs/placement.txt"

# 3. Per-GPU colocation, then the loop alone on its own GPU, directly.
names=()
for g in $(seq 0 $((gpus - 1))); do
    start_hp "hp$g" gs run --class high --gpu "$g" --
    start_be "be$g" --gpu "$g"
    names+=("hp$g" "be$g")
done
wait_ready "${names[@]}" && go
finish
start_hp dedicated env CUDA_VISIBLE_DEVICES=0
wait_ready dedicated && go
finish

# 4. Faults on GPU 0 beside a loop on every GPU.
stop=$work/stop
for g in 0 1; do
    "$dir/gpushare" run --gpu "$g" -- env PYTHONUNBUFFERED=1 timeout 300 "$py" "$dir/faults/victims.py" infer \
        --stop "$stop" --think-ms 2 --out "$logs/victim$g.jsonl" 2> "$logs/victim$g.err" &
    pids+=($!)
done
for g in 0 1; do
    for _ in $(seq 1200); do grep -q '"ready"' "$logs/victim$g.jsonl" 2> /dev/null && break; sleep 0.1; done
done
sleep 2
for kind in assert illegal; do
    for _ in $(seq "${FAULTS:-3}"); do
        timeout 120 "$dir/gpushare" run --gpu 0 -- "$py" "$dir/faults/culprit.py" "$kind" \
            >> "$logs/culprits.jsonl" 2>> "$logs/culprit.err"
        sleep 1.5
    done
done
sleep 2
touch "$stop"
finish

"$py" - "$logs" "$gpus" << 'EOF' | tee "$logs/summary.txt"
import json, sys
logs, gpus = sys.argv[1], int(sys.argv[2])
def load(name):
    try:
        return json.load(open(f"{logs}/{name}.json"))
    except (OSError, ValueError):
        return {}
print(open(f"{logs}/placement.txt").read().strip())
ded = load("dedicated")
print(f"HP alone, direct: p50 {ded.get('p50_ms', float('nan')):.3f} ms, p99 {ded.get('p99_ms', float('nan')):.3f} ms")
for g in range(gpus):
    hp, be = load(f"hp{g}"), load(f"be{g}")
    p99 = hp.get("p99_ms", float("nan"))
    ratio = p99 / ded["p99_ms"] if ded.get("p99_ms") else float("nan")
    print(f"GPU {g}: HP beside a BE trainer p50 {hp.get('p50_ms', float('nan')):.3f} ms, p99 {p99:.3f} ms ({ratio:.2f} x dedicated); BE {be.get('it_per_s', float('nan')):.1f} it/s")
faults = []
try:
    faults = [json.loads(l) for l in open(f"{logs}/culprits.jsonl") if l.strip()]
except (OSError, ValueError):
    pass
first = min((f["t_fault"] for f in faults if "t_fault" in f), default=None)
print(f"faults on GPU 0: {len(faults)} programs, errors seen: " + "; ".join(sorted({f.get('error', '?')[:60] for f in faults})))
for g in range(2):
    try:
        rows = [json.loads(l) for l in open(f"{logs}/victim{g}.jsonl") if l.strip()]
    except (OSError, ValueError):
        print(f"loop on GPU {g}: no output")
        continue
    reqs = [r for r in rows if "ms" in r]
    before = sorted(r["ms"] for r in reqs if first is None or r["t"] < first)
    after = sorted(r["ms"] for r in reqs if first is not None and r["t"] >= first)
    bad = [r for r in reqs if not r.get("correct")]
    pct = lambda xs, q: xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")
    print(f"loop on GPU {g}: {len(reqs)} requests, {len(bad)} failed or wrong"
          + (f" (first: {bad[0].get('error', 'wrong answer')[:80]})" if bad else "")
          + f"; before the faults p50 {pct(before, 0.5):.3f} ms, during and after p50 {pct(after, 0.5):.3f} p99 {pct(after, 0.99):.3f} max {max(after, default=float('nan')):.1f} ms")
EOF
