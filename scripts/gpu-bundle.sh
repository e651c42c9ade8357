#!/usr/bin/env bash
# Builds everything a GPU machine without a Rust toolchain needs to run gpushare's GPU tests
# and benchmarks, stripped, into one folder (default .gpu/, ignored by git):
#   gpushared gpushare gpushare-demo and the test helpers, libgpushare.so, the integration-test
#   executables (named after their test files), gpu-test.sh to run them, gpushare-bench
#   when it exists, the libraries of `gpushare run` (libgpushare_audit.so, and gpushare's
#   CUDA driver as libcuda.so with cuda/libcuda.so.1 and cuda/libcuda.so linked to it, the
#   layout `gpushare run` looks for beside itself), and the governed-clients PyTorch check
#   (libgpushare_interpose.so, gpu-pytorch-governed.sh, governed/*.py) and the consolidated-
#   clients one (gpu-pytorch-consolidated.sh, consolidated/*.py and its launch program), the
#   colocation benchmark (gpu-pytorch-colocate.sh, colocate/*.py), and GPU faults beside
#   PyTorch programs (gpu-pytorch-faults.sh, faults/*.py), the coverage matrix of frameworks
#   (gpu-coverage.sh, coverage/*), the CUDA graph decode benchmark (gpu-graph-bench.sh), FAIR
#   against FIFO for many programs (gpu-fair-many.sh), several GPUs (gpu-multi-gpu.sh, gpu-ddp.sh),
#   and the probes of where module
#   globals land in a worker that takes over (module_globals), of what a forked child gets
#   (fork_pinned), of the launch shapes CUDA refuses (launch_shapes), and of where the two
#   workers' address spaces differ (probes/worker_maps.sh), and of the driver calls one JAX or
#   CuPy step makes (probes/step_calls.py) and a host function's latency (probes/host_fn_latency.py), what one process on two GPUs meets at the edges (probes/two_gpu_edges.py), how a host thread learns a stream finished (probes/sync_poll.c, built there with nvcc), what a launch costs by stream priority (probes/launch_rate.c) and beside other threads (probes/launch_company.c) and what gpushared's fault check costs a launching thread (probes/fault_check.c) and how XLA's GPU timer times work through gpushare (probes/timer_gate.c) and a TMA kernel (probes/tma_gate.cu), and what else lengthens a timed kernel (probes/candidate_gate.cu: shared memory, clusters, PDL, small copies, a pause, events), what gpushared's marks and timings between kernels cost (probes/stream_ops_rate.cu), what the priority gate does for a request beside best-effort streams in one process (probes/be_gate.cu), which streams a gated stream holds (probes/gate_channels.cu) and which driver calls wait behind it (probes/gate_sync.cu), DataParallel's step over every GPU (probes/dp_step.py), and whether a tensor map depends on its
#   arguments alone and what encoding one costs (probes/tensor_map_same.py, probes/tensor_map_rate.py). Copy
#   the folder to the GPU machine and run `./gpu-test.sh` (and the PyTorch checks) inside it.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-.gpu}
mkdir -p "$out"

target=${CARGO_TARGET_DIR:-target}
cargo build --release --locked --workspace --quiet
for bin in gpushared gpushare gpushare-demo gpushare-testclient gpushare-ioctl-child gpushare-telemetry-watch gpushare-bench libgpushare.so libgpushare_interpose.so libgpushare_audit.so libcuda.so libgpushare_nvml.so; do
    [[ -f $target/release/$bin ]] && cp "$target/release/$bin" "$out/"
done
# gpushare's CUDA driver where `gpushare run` finds it: a directory that holds only the driver
# (it goes first on the program's LD_LIBRARY_PATH), under the names the loader looks for.
mkdir -p "$out/cuda"
ln -sfn ../libcuda.so "$out/cuda/libcuda.so.1"
ln -sfn ../libcuda.so "$out/cuda/libcuda.so"
ln -sfn ../libgpushare_nvml.so "$out/cuda/libnvidia-ml.so.1"

# Integration-test executables: ask cargo where it put them.
cargo test --release --locked -p gpushare-tests --no-run --message-format=json 2>/dev/null |
    python3 -c '
import json, shutil, sys
out = sys.argv[1]
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("profile", {}).get("test") and m.get("executable"):
        kinds = m["target"]["kind"]
        if "test" in kinds:
            name = m["target"]["name"]
            shutil.copy(m["executable"], out + "/test-" + name)
' "$out"

cp scripts/gpu-test.sh scripts/gpu-pytorch-governed.sh scripts/gpu-pytorch-consolidated.sh scripts/gpu-pytorch-fair.sh \
    scripts/gpu-pytorch-colocate.sh scripts/gpu-pytorch-faults.sh "$out/"
mkdir -p "$out/governed" "$out/consolidated" "$out/colocate" "$out/faults" "$out/coverage" "$out/ddp"
cp scripts/gpu-coverage.sh scripts/gpu-graph-bench.sh scripts/gpu-multi-gpu.sh scripts/gpu-ddp.sh scripts/gpu-fair-many.sh "$out/"
cp scripts/ddp/*.py "$out/ddp/"
cp scripts/coverage/*.py scripts/coverage/*.c "$out/coverage/"
cp scripts/faults/*.py "$out/faults/"
cp scripts/governed/*.py "$out/governed/"
cp scripts/colocate/*.py "$out/colocate/"
cp scripts/consolidated/*.py scripts/consolidated/launch.c "$out/consolidated/"
cc -O2 -o "$out/consolidated/launch" scripts/consolidated/launch.c -ldl
cc -O2 -o "$out/module_globals" scripts/probes/module_globals.c -ldl
cc -O2 -o "$out/fork_pinned" scripts/probes/fork_pinned.c -ldl
cc -O2 -o "$out/launch_shapes" scripts/probes/launch_shapes.c -ldl
cc -O2 -o "$out/sm_ids" scripts/probes/sm_ids.c -ldl
mkdir -p "$out/probes" && cp scripts/probes/worker_maps.sh scripts/probes/step_calls.py scripts/probes/host_fn_latency.py scripts/probes/two_gpu_edges.py scripts/probes/dp_step.py scripts/probes/tensor_map_same.py scripts/probes/tensor_map_rate.py scripts/probes/graph_update.c scripts/probes/sync_poll.c scripts/probes/launch_rate.c scripts/probes/launch_company.c scripts/probes/fault_check.c scripts/probes/timer_gate.c scripts/probes/tma_gate.cu scripts/probes/candidate_gate.cu scripts/probes/stream_ops_rate.cu scripts/probes/be_gate.cu scripts/probes/gate_channels.cu scripts/probes/gate_sync.cu scripts/probes/gate.cuh scripts/probes/probe.h scripts/probes/timing.h "$out/probes/"
# strip(1) warns about the cuda/ directory and goes on.
strip "$out"/* "$out/consolidated/launch" 2>/dev/null || true
du -sh "$out"
ls "$out"
