#!/usr/bin/env bash
# Telemetry on the GPU machine: decoded PyTorch activity, and overhead on real GPU work.
set -u
cd "$(dirname "$0")"
W=./gpushare-telemetry-watch
chmod +x ./gpushare-telemetry-watch ./telemetry-bench ./gpushare-ioctl-child 2>/dev/null
uname -r; nvidia-smi -L; python3 -c 'import torch; print("torch", torch.__version__)'
mount | grep -c tracefs || true
ls -la /dev/nvidia*
ldconfig -p | grep libcuda.so.1
what=${1:-all}
if [[ $what == all || $what == demo ]]; then
  echo "=== PyTorch inference under telemetry (uprobes on)"
  $W --json "$OUT/infer.json" -- python3 infer.py 3 2>&1
fi
if [[ $what == all || $what == overhead ]]; then
  export PYTORCH_NO_CUDA_MEMORY_CACHING=1
  for round in 1 2; do
    for mode in "--detached" "--no-uprobes" ""; do
      echo "=== alloc round $round mode '${mode:-uprobes}'"
      $W $mode -- python3 alloc.py 3000 2>&1 | grep -E "alloc:|RM_|UVM_|pid|watch\]"
    done
  done
  unset PYTORCH_NO_CUDA_MEMORY_CACHING
  for round in 1 2; do
    for mode in "--detached" "--no-uprobes" ""; do
      echo "=== launch round $round mode '${mode:-uprobes}'"
      $W $mode -- python3 launch.py 200000 2>&1 | grep -E "launch:|pid|watch\]"
    done
  done
fi
if [[ $what == all || $what == bench ]]; then
  echo "=== stand-in ioctl bench"
  ./telemetry-bench --bench zzz 2>&1 | tail -8
fi
