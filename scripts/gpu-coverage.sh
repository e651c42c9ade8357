#!/usr/bin/env bash
# The coverage matrix: programs of several frameworks run directly (twice) and through
# gpushare (`gpushare run`, consolidated), results compared. A case passes when the
# consolidated run's values equal the first direct run's, or differ from them by no more than
# the two direct runs differ from each other. Runs from the folder scripts/gpu-bundle.sh makes
# (gpushared, gpushare, libcuda.so, coverage/); needs python3 with the frameworks a case uses
# (a missing one makes that case "skipped: no module"), and cc with CUDA's headers for the C
# cases (c-libraries also CUDA's cuBLAS, cuFFT, cuRAND and runtime libraries in
# /usr/local/cuda/lib64, and cuDNN's headers and library: those of the Python package
# nvidia-cudnn PyTorch brings, else CUDA's or the system's; without them the case is skipped).
# Prints a markdown table; stderr of each run goes to $LOGS/CASE.MODE.err (a C program's build
# to $LOGS/cc.err), and the first line gpushare's driver said there is shown for a failing case.
#
# Cases: torch-* (scripts/coverage/torch_prog.py: expandable segments, CUDA IPC, torchvision's
# resnet18, transformers' BERT, torch.compile, CUDA graphs, NCCL in one process; decode_prog.py:
# a decode loop whose steps are CUDA graphs, captured or torch.compile's "reduce-overhead"),
# jax-* (jax_prog.py), cupy-* (cupy_prog.py), numba-kernel (numba_prog.py), cuda-python and cuda-python-jitlink
# (cuda_python_prog.py: PTX loaded by the driver, or linked by nvJitLink first), triton-kernel
# (triton_prog.py), and the C programs c-vmm-pool (vmm_pool.c) and c-libraries (libs.c).
#
# Cases ending in -nocb run JAX with XLA's command buffers (CUDA graphs built node by node) off,
# to compare. XLA's autotuner picks kernels by timing them, and two direct runs can pick
# differently (jax-train: 2 of 7 fusions on the H200, 2026-12-01), so a JAX case's values can
# differ by more than its two direct runs did for no fault of gpushare's. Each JAX run writes
# its picks (--xla_gpu_dump_autotune_results_to); where the consolidated run's values differ
# by more than the direct runs', a third direct run loads the consolidated run's picks
# (--xla_gpu_load_autotune_results_from) and the case passes only if the two are equal. A case whose program reports its time per step ("ms") gets that time against the
# faster direct run beside its result.
#
# Usage: ./gpu-coverage.sh [CASE...]  (default: every case). Exit status: non-zero if a case
# that could run failed. STEP_TIMEOUT (default 300) bounds each run in seconds.
#
# Speed instead of the matrix (issue 29 point 5): with ROUNDS=N, each named case that reports
# its time per step runs N rounds, each round directly and through gpushare in turn (the order
# alternating from round to round), with TIMED_STEPS (default 2000) timed steps a run after
# WARM_S (default 1) seconds of untimed ones (coverage/timing.py); with
# BASE=<another bundle folder>, that bundle's gpushared serves a third run each round (two
# builds side by side). Prints each round's medians and each build's ratio to the same round's
# direct run, then the median ratio over rounds. A JAX case's first run writes its autotuning
# picks and every later run loads them, so that all run the same kernels. XLA_FLAGS, if set,
# goes to every run alike. PROGRAM_CPUS (a
# taskset list) pins every program, run directly or through gpushare, to those CPUs.
set -uo pipefail
dir=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-python3}
work=$(mktemp -d)
logs=${LOGS:-$work/logs}
mkdir -p "$logs"
sock=$work/gpushare.sock
broker_pid=
trap '[[ -n $broker_pid ]] && kill -TERM $broker_pid ${base_pid:-} 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT

all=(torch-expandable torch-mallocasync torch-ipc torch-resnet torch-bert torch-compile torch-graphs
     torch-decode-graph torch-decode-compiled torch-nccl
     jax-jit jax-grad jax-train jax-loop jax-jit-nocb jax-grad-nocb jax-train-nocb
     cupy-elementwise cupy-rawkernel cupy-asyncpool cupy-cublas cupy-cufft cupy-cusolver cupy-cusparse
     cupy-random numba-kernel cuda-python cuda-python-jitlink triton-kernel c-vmm-pool c-libraries)
cases=("$@")
[[ ${#cases[@]} -gt 0 ]] || cases=("${all[@]}")

start_broker() { # start_broker BUNDLE SOCKET LOG: a gpushared of BUNDLE, ready (its pid in $!)
    "$1/gpushared" --socket "$2" --backend "${BACKEND:-cuda}" --no-telemetry --log warn \
        ${BROKER_ARGS:-} 2>> "$3" &
    for _ in $(seq 100); do
        "$1/gpushare" --socket "$2" status > /dev/null 2>&1 && break
        sleep 0.1
    done
    return 0 # $! is still the broker's
}
start_broker "$dir" "$sock" "$logs/broker.log"
broker_pid=$!
base_pid=
if [[ -n ${BASE:-} ]]; then
    start_broker "$BASE" "$work/base.sock" "$logs/base-broker.log"
    base_pid=$!
fi

build_libs() { # builds coverage/libs.c as $work/libs, with cuDNN where one is found
    local cu=/usr/local/cuda root d lib dnn=(-DNO_CUDNN) rpath=()
    # The folders the program finds its libraries in at run time (-rpath, so that nothing is
    # added to LD_LIBRARY_PATH, where `gpushare run` puts its driver first). As DT_RPATH
    # (--disable-new-dtags): cuDNN's libcudnn.so loads its sub-libraries (libcudnn_cnn.so.9...)
    # with dlopen by name, which searches the executable's DT_RPATH but not its DT_RUNPATH. A
    # DT_RPATH comes before LD_LIBRARY_PATH, so a folder that holds a libcuda.so is left out.
    add_rpath() { compgen -G "$1/libcuda.so*" > /dev/null || rpath+=(-Wl,-rpath,"$1"); }
    root=$("$py" -c 'import nvidia.cudnn as m; print(list(m.__path__)[0])' 2>/dev/null)
    for d in "$root" "$cu"; do # the Python package's (include/, lib/libcudnn.so.9), CUDA's
        [[ -n $d ]] || continue
        lib=$(ls "$d"/lib/libcudnn.so* "$d"/lib64/libcudnn.so* 2> /dev/null | head -1)
        if [[ -f $d/include/cudnn.h && -n $lib ]]; then
            dnn=(-I"$d/include" "$lib")
            add_rpath "${lib%/*}"
            break
        fi
    done
    # The system's (a package's /usr/include/cudnn.h and libcudnn.so, found without -rpath).
    if [[ ${dnn[0]} == -DNO_CUDNN ]] && [[ -f /usr/include/cudnn.h || -f /usr/include/x86_64-linux-gnu/cudnn.h ]]; then
        dnn=(-I/usr/include/x86_64-linux-gnu -lcudnn)
    fi
    [[ ${dnn[0]} == -DNO_CUDNN ]] && echo "c-libraries: no cuDNN found, built without it" >> "$logs/cc.err"
    add_rpath "$cu/lib64"
    cc -O2 -I"$cu/include" -o "$work/libs" "$dir/coverage/libs.c" "${dnn[@]}" -L"$cu/lib64" \
        -lcublas -lcufft -lcurand -lcudart -lm -Wl,--disable-new-dtags "${rpath[@]}" 2>> "$logs/cc.err"
}

command_of() { # the command line of a case
    case $1 in
    torch-expandable) echo env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "$py" "$dir/coverage/torch_prog.py" expandable ;;
    torch-ipc) echo "$py" "$dir/coverage/torch_prog.py" ipc ;;
    torch-mallocasync) echo env PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync "$py" "$dir/coverage/torch_prog.py" mallocasync ;;
    # A GPT-2-sized decode loop, one CUDA graph a token: captured, or torch.compile's.
    torch-decode-*) echo env STEPS=60 "$py" "$dir/coverage/decode_prog.py" "${1#torch-decode-}" ;;
    # resnet (torchvision), bert (transformers), compile (torch.compile), graphs (CUDA graphs)
    torch-*) echo "$py" "$dir/coverage/torch_prog.py" "${1#torch-}" ;;
    # -nocb: XLA's command buffers (CUDA graphs built node by node) off.
    jax-*-nocb) c=${1#jax-}; echo "$py" "$dir/coverage/jax_prog.py" "${c%-nocb}" ;;
    jax-*) echo "$py" "$dir/coverage/jax_prog.py" "${1#jax-}" ;;
    cupy-*) echo "$py" "$dir/coverage/cupy_prog.py" "${1#cupy-}" ;;
    numba-kernel) echo "$py" "$dir/coverage/numba_prog.py" kernel ;;
    cuda-python) echo "$py" "$dir/coverage/cuda_python_prog.py" ptx ;;
    cuda-python-jitlink) echo "$py" "$dir/coverage/cuda_python_prog.py" jitlink ;;
    triton-kernel) echo "$py" "$dir/coverage/triton_prog.py" kernel ;;
    c-vmm-pool)
        [[ -x $work/vmm_pool ]] || cc -O2 -I/usr/local/cuda/include -o "$work/vmm_pool" \
            "$dir/coverage/vmm_pool.c" -L/usr/local/cuda/lib64/stubs -lcuda 2>> "$logs/cc.err"
        echo "$work/vmm_pool" ;;
    c-libraries)
        [[ -x $work/libs ]] || build_libs
        echo "$work/libs" ;;
    esac
}

xla_flags() { # xla_flags CASE [FLAG]: XLA_FLAGS for a run of CASE, with FLAG added
    local f=${XLA_FLAGS:-}
    [[ $1 == jax-*-nocb ]] && f+=" --xla_gpu_enable_command_buffer="
    echo "$f${2:+ $2}"
}

picks() { # picks CASE FILE: the XLA flag for a JAX run: load FILE's picks, or write them there
    [[ $1 == jax-* ]] || return 0
    if [[ -s $2 ]]; then echo "--xla_gpu_load_autotune_results_from=$2"
    else echo "--xla_gpu_dump_autotune_results_to=$2"; fi
}

run() { # run CASE MODE N [XLA_FLAG]: the case's last stdout line (a JSON object)
    local c=$1 mode=$2 n=$3 line cmd
    cmd=$(command_of "$c")
    local prefix=()
    [[ -n ${PROGRAM_CPUS:-} ]] && prefix=(taskset -c "$PROGRAM_CPUS")
    [[ $mode == consolidated ]] && prefix+=("$dir/gpushare" --socket "$sock" run --)
    [[ $mode == base ]] && prefix+=("$BASE/gpushare" --socket "$work/base.sock" run --)
    # shellcheck disable=SC2086 # the command is words
    line=$(XLA_FLAGS=$(xla_flags "$c" "${4:-}") timeout "${STEP_TIMEOUT:-300}" "${prefix[@]}" $cmd \
        2>> "$logs/$c.$mode$n.err" | tail -1)
    [[ $line == "{"* ]] || line="{\"ok\": false, \"error\": \"no result (exit ${PIPESTATUS[0]})\"}"
    echo "$line"
}

if [[ -n ${ROUNDS:-} ]]; then
    export TIMED_STEPS=${TIMED_STEPS:-2000} WARM_S=${WARM_S:-1}
    modes=(direct consolidated)
    [[ -n ${BASE:-} ]] && modes+=(base)
    for c in "${cases[@]}"; do
        : > "$logs/$c.speed"
        for r in $(seq "$ROUNDS"); do
            # Alternate who goes first: odd rounds in order, even rounds reversed.
            order=("${modes[@]}")
            if (( r % 2 == 0 )); then
                order=()
                for m in "${modes[@]}"; do order=("$m" "${order[@]}"); done
            fi
            for m in "${order[@]}"; do
                echo "$r $m $(run "$c" "$m" "$r" "$(picks "$c" "$work/$c.picks.txt")")" >> "$logs/$c.speed"
            done
        done
        echo "## $c (${ROUNDS} rounds of $TIMED_STEPS steps after ${WARM_S} s; ms per step, median of each run)"
        "$py" - "$logs/$c.speed" "${modes[@]}" <<'PY'
import json, statistics, sys
path, modes = sys.argv[1], sys.argv[2:]
rounds = {}
for line in open(path):
    r, m, rest = line.split(" ", 2)
    rounds.setdefault(int(r), {})[m] = json.loads(rest)
others = modes[1:]
print("| round | " + " | ".join(modes) + " | " + " | ".join(f"{m} / direct" for m in others) + " |")
print("|---" * (1 + len(modes) + len(others)) + "|")
ratios = {m: [] for m in others}
for r in sorted(rounds):
    got = rounds[r]
    ms = [got.get(m, {}).get("ms") for m in modes]
    cells = [f"{v:.4f}" if v else "fails: " + got.get(m, {}).get("error", "no result")[:60]
             for m, v in zip(modes, ms)]
    rs = []
    for m, v in zip(others, ms[1:]):
        if v and ms[0]:
            ratios[m].append(v / ms[0])
            rs.append(f"{v / ms[0]:.3f}")
        else:
            rs.append("-")
    print(f"| {r} | " + " | ".join(cells) + " | " + " | ".join(rs) + " |")
for m in others:
    v = ratios[m]
    if v:
        print(f"{m} / direct: median {statistics.median(v):.3f} over {len(v)} rounds "
              f"(range {min(v):.3f}-{max(v):.3f})")
PY
    done
    exit 0
fi

failed=0
echo "| case | direct | consolidated | result |"
echo "|---|---|---|---|"
for c in "${cases[@]}"; do
    d1=$(run "$c" direct 1 "$(picks "$c" "$work/$c.direct1.picks.txt")")
    d2=$(run "$c" direct 2 "$(picks "$c" "$work/$c.direct2.picks.txt")")
    g=$(run "$c" consolidated 1 "$(picks "$c" "$work/$c.consolidated1.picks.txt")")
    said=$(grep -m1 '^gpushare:' "$logs/$c.consolidated1.err" 2>/dev/null | cut -c1-160)
    verdict=$("$py" - "$d1" "$d2" "$g" "$said" <<'PY'
import json, sys
d1, d2, g = (json.loads(a) for a in sys.argv[1:4])
said = sys.argv[4]
def err(r): return r.get("error", "")[:90].replace("|", "/")
if not d1.get("ok"):
    skip = "No module named" in err(d1)
    print(("skipped: " if skip else "direct fails: ") + f"{err(d1)}\t-\t" + ("skip" if skip else "bad"))
    sys.exit()
a = d1["values"]
b, c = d2.get("values", a), g.get("values")
spread = max((abs(x - y) for x, y in zip(a, b)), default=0.0)
if c is None:
    print(f"ok\tfails: {err(g)}{' — ' + said if said else ''}\tFAIL")
elif len(c) != len(a):
    print(f"ok\t{len(c)} values, not {len(a)}\tFAIL")
else:
    diff = max((abs(x - y) for x, y in zip(a, c)), default=0.0)
    t = ""
    if "ms" in g and "ms" in d1:
        fastest = min(d1["ms"], d2.get("ms", d1["ms"]))
        t = f"; {g['ms']:.3f} ms against {fastest:.3f} ms direct ({g['ms'] / fastest:.2f} x)"
    if diff == 0:
        print(f"ok\tequal{t}\tPASS")
    elif diff <= spread:
        print(f"ok (runs differ by {spread:.3g})\tdiffers by {diff:.3g}{t}\tPASS")
    else:
        print(f"ok (runs differ by {spread:.3g})\tdiffers by {diff:.3g}{t}\tFAIL")
PY
)
    IFS=$'\t' read -r dcol gcol res <<< "$verdict"
    picked=$work/$c.consolidated1.picks.txt
    if [[ $res == FAIL && $c == jax-* && -s $picked ]]; then
        # Its own picks, run directly: equal values say the difference was the picks'.
        d3=$(run "$c" direct 3 "--xla_gpu_load_autotune_results_from=$picked")
        if "$py" -c 'import json, sys; a, b = (json.loads(x).get("values") for x in sys.argv[1:]); sys.exit(a is None or a != b)' "$g" "$d3"; then
            res=PASS gcol="$gcol; equal to a direct run of its autotuning picks"
        fi
    fi
    case $res in
    PASS) echo "| $c | $dcol | $gcol | pass |" ;;
    skip) echo "| $c | $dcol | - | skipped |" ;;
    bad) echo "| $c | $dcol | - | cannot compare |" ;;
    *) failed=1; echo "| $c | $dcol | $gcol | **fail** |" ;;
    esac
done
exit $failed
