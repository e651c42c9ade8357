#!/usr/bin/env bash
# Where the serving device worker's address space and its spare's differ, after a PyTorch
# program's first GEMM through the serving worker: the CUDA driver reserves module data's
# addresses after whatever a worker mapped before, so a difference below the client's
# modules moves their globals in the worker that takes over (docs/reliability.md, "What a
# fault costs now"). Runs from the folder scripts/gpu-bundle.sh makes, on a GPU machine with
# python3 and a CUDA build of torch.
#
#   ./probes/worker_maps.sh OUT_DIR     writes maps-PID.txt for each worker, and prog.out/.err
set -u
dir=$(cd "$(dirname "$0")/.." && pwd)
out=${1:?usage: worker_maps.sh OUT_DIR}
mkdir -p "$out"
w=$(mktemp -d)
chmod 755 "$w"
mkdir -p "$w/bin/cuda"
cp "$dir/gpushare" "$dir/libcuda.so" "$dir/libgpushare_audit.so" "$w/bin/"
ln -s ../libcuda.so "$w/bin/cuda/libcuda.so.1"
ln -s ../libcuda.so "$w/bin/cuda/libcuda.so"
sock=$w/s.sock
"$dir/gpushared" --socket "$sock" --backend cuda --no-telemetry --log info 2> "$out/broker.log" &
broker=$!
trap 'kill "$broker" 2> /dev/null; wait "$broker" 2> /dev/null; rm -rf "$w"' EXIT
for _ in $(seq 100); do "$dir/gpushare" --socket "$sock" status > /dev/null 2>&1 && break; sleep 0.1; done
cat > "$w/prog.py" <<'PY'
import time
import torch
a = torch.randn(256, 256, device="cuda")
(a @ a).sum().item()
print("ready", flush=True)
time.sleep(15)
PY
timeout 60 "$w/bin/gpushare" --socket "$sock" run -- python3 "$w/prog.py" > "$out/prog.out" 2> "$out/prog.err" &
prog=$!
for _ in $(seq 300); do grep -q ready "$out/prog.out" 2> /dev/null && break; sleep 0.1; done
for p in $(pgrep -f -- "--device-worker"); do cp "/proc/$p/maps" "$out/maps-$p.txt"; done
kill "$prog" 2> /dev/null
wait "$prog" 2> /dev/null
ls "$out"
