#!/usr/bin/env bash
# Jobs over several GPUs (issue 32, point 2), from the folder scripts/gpu-bundle.sh makes;
# needs python3 with a CUDA build of torch and at least two GPUs. `JOB=ddp` (the default): a
# PyTorch DDP job of one process per GPU, scripts/ddp/ddp_check.py under torchrun; `JOB=one`:
# one process working on two GPUs, scripts/ddp/one_process.py (tensors moved between them, a
# model split over both, a copy's bandwidth between them). Each runs directly and under
# `gpushare run --gpus N`, rounds interleaved, and its results are printed: the trained
# weights' checksum and losses must be equal, and the step time and bandwidths are set against
# direct. NCCL's log (NCCL_DEBUG=INFO) says which transport joined DDP's ranks.
# Settings: JOB (ddp), GPUS (2), ROUNDS (2), LOGS (default $work/logs), PYTHON (python3). Exit
# status: non-zero if a run failed (the results' comparison is the reader's).
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0).
set -uo pipefail
dir=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-python3}
gpus=${GPUS:-2}
rounds=${ROUNDS:-2}
export NCCL_NVLS_ENABLE=0 NCCL_DEBUG=INFO
work=$(mktemp -d /tmp/gpuddp.XXXXXX)
logs=${LOGS:-$work/logs}
mkdir -p "$logs"
broker_pid=
cleanup() {
    if [[ -n $broker_pid ]]; then kill "$broker_pid" 2> /dev/null; wait "$broker_pid" 2> /dev/null; fi
}
trap cleanup EXIT

sock=$work/gpushare.sock
timeout $((rounds * 300 + 120)) "$dir/gpushared" --socket "$sock" --backend cuda --gpu all \
    --no-telemetry 2> "$logs/gpushared.log" &
broker_pid=$!
for _ in $(seq 1 300); do [[ -S $sock ]] && break; sleep 0.1; done
[[ -S $sock ]] || { echo "gpushared did not start" >&2; exit 2; }

job() { # how round
    local how=$1 round=$2 out="$logs/$1-$2"
    local cmd=(timeout 280 "$py" -m torch.distributed.run --standalone --nproc_per_node "$gpus"
        "$dir/ddp/ddp_check.py")
    [[ ${JOB:-ddp} == one ]] && cmd=(timeout 280 "$py" "$dir/ddp/one_process.py")
    if [[ $how == gpushare ]]; then
        cmd=(timeout 280 "$dir/gpushare" --socket "$sock" run -v --gpus "$gpus" -- "${cmd[@]:2}")
    fi
    GPUSHARE_CUDA_TRACE=1 "${cmd[@]}" > "$out.out" 2> "$out.err"
    local rc=$?
    echo "== $how round $round: exit $rc"
    grep -E '^(devices|moved|step_loss|checksum|step_ms|allreduce_[a-z_]+|copy_gbps|transposed) ' "$out.out"
    grep -h 'its first work' "$out.err" | sort | uniq -c
    grep -hoE 'via (P2P|SHM|NET)[^ ]*( [^ ]+)?' "$out.out" "$out.err" | sort | uniq -c | head -5
    return $rc
}
status=0
for round in $(seq 1 "$rounds"); do
    job direct "$round" || status=1
    job gpushare "$round" || status=1
done
exit $status
