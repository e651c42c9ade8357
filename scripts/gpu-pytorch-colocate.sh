#!/usr/bin/env bash
# Colocation benchmark with PyTorch on one GPU: a high-priority (HP) inference loop beside
# best-effort (BE) training loops, under several ways of sharing the GPU. Runs from the folder
# that scripts/gpu-bundle.sh makes (gpushared, gpushare, libcuda.so, libgpushare_audit.so,
# libgpushare_interpose.so, colocate/*.py); needs python3 with a CUDA build of torch, and no
# Rust toolchain. From a checkout, BIN=target/release (or debug) names the binaries.
#
# Pairs (PAIRS):
#   mlp:  HP = 6 x (Linear 2048 + GELU) at batch 8; BE = the same MLP training at batch 512 (SGD).
#   bert: HP = one BERT-base encoder layer (hidden 768, 12 heads, FFN 3072, seq 128) at batch
#         HP_BATCH_BERT (4); BE = a 4-layer transformer (d 512, seq 256, batch 16, AdamW, bf16).
#   An HP request is a forward under torch.no_grad + torch.cuda.synchronize, THINK_MS (2) of
#   sleep between requests; HP reports p50/p99 latency, each BE trainer iterations/s.
# Setups (SETUPS):
#   alone       HP alone, and one BE trainer alone (the dedicated-GPU baselines)
#   plain       side by side, each its own CUDA context (time-slicing)
#   mps         side by side under the MPS daemon (private pipe and log folders)
#   governed    gpushared, scheduler "priority"; `gpushare run --mode governed`, HP --class
#               high, BE --class best-effort
#   cons        the same, consolidated (`gpushare run`'s default mode)
#   cons-lowsm  consolidated with `[priority] lower_sm_share = LOWSM_SHARE` (0.5)
#   cons-domain consolidated, the HP program's user in a trust domain of its own (a GPU context
#               of its own, so its memory is out of the trainers' reach); needs USERS=two
#   cons-domain-beside  the same with `[priority] beside_other_contexts = true`: trainers'
#               kernels may be granted beside HP work in flight although the GPU switches
#               contexts for them (the rule it lifts holds them for a gap instead)
# Cells: for each round, for each setup, pair and trainer count (TRAINERS, "1 4"; 0 = HP
# alone in that setup), one cell. Every program warms up, then says it is ready; the window
# (SECS, 5) starts only when all of a cell's programs are ready, so start-up never counts.
#
# Other settings: BE_GRAPHS (set: each BE iteration of the mlp pair is one CUDA graph replay),
# ROUNDS (2), USERS (same | two: the HP program runs as the Unix user HP_USER,
# default gpucolo, created if missing; needs root), HP_BATCH_MLP (8), HP_DTYPE (float32),
# BROKER_ARGS (--no-telemetry), SCHEDULER (priority: the broker setups' policy),
# PRIORITY_OPTS (lines for the policy's [priority] table in every broker setup, separated by
# ";", e.g. "gate = false; lower_depth = 2"), BROKER_LOG (gpushared's --log filter,
# "warn,gpushare_broker::device::cuda::partition=info"),
# READY_TIMEOUT (120 s for a cell's programs to get ready),
# STRAGGLER_S (30: a program still not ready this long after the others were is given up on;
# under MPS with two users that is the expected "blocked" result), EXIT_TIMEOUT (60),
# LOGS (default $work/logs, kept), PYTHON (python3), COLO_DEVICE=cpu (tiny models on the CPU,
# the sim broker, no MPS: for testing the harness without a GPU).
#
# Output: a line per cell as it finishes; each cell's record appended to $LOGS/colocate.jsonl
# at once; at the end colocate/summarize.py's table of medians across rounds (it takes several
# jsonl files too). Each cell's programs' stderr and broker log: $LOGS/<cell>.<name>.err,
# $LOGS/<cell>.broker.log.
set -uo pipefail
dir=$(cd "$(dirname "$0")" && pwd)
bin=$(cd "${BIN:-$dir}" && pwd)
py=${PYTHON:-python3}
device=${COLO_DEVICE:-cuda}
export COLO_DEVICE=$device
setups=${SETUPS:-alone plain mps governed cons cons-lowsm}
pairs=${PAIRS:-mlp bert}
trainer_counts=${TRAINERS:-1 4}
rounds=${ROUNDS:-2}
secs=${SECS:-5}
users=${USERS:-same}
think=${THINK_MS:-2}
hp_user=${HP_USER:-gpucolo}
hp_batch_mlp=${HP_BATCH_MLP:-8}
hp_batch_bert=${HP_BATCH_BERT:-4}
hp_dtype=${HP_DTYPE:-float32}
lowsm_share=${LOWSM_SHARE:-0.5}
broker_args=${BROKER_ARGS:---no-telemetry}
scheduler=${SCHEDULER:-priority}
priority_opts=${PRIORITY_OPTS:-}
broker_log=${BROKER_LOG:-warn,gpushare_broker::device::cuda::partition=info}
ready_timeout=${READY_TIMEOUT:-120}
straggler=${STRAGGLER_S:-30}
exit_timeout=${EXIT_TIMEOUT:-60}
grace=0.3
if [[ $device == cpu ]]; then backend=${BACKEND:-sim}; else backend=${BACKEND:-cuda}; fi
step_timeout=$(awk -v a="$ready_timeout" -v b="$secs" -v c="$exit_timeout" 'BEGIN { printf "%d", a + b + c + 30 }')

work=$(mktemp -d /tmp/gpucolo.XXXXXX)
chmod 755 "$work"
logs=${LOGS:-$work/logs}
mkdir -p "$logs"
logs=$(cd "$logs" && pwd)
results=$logs/colocate.jsonl
sock=$work/gpushare.sock
run_id=$(date +%Y%m%d-%H%M%S)-$$
broker_pid=
mps_on=
pids=()
names=()

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# Every process a cell starts has $work/ in its command line: the marker for leftovers.
kill_leftovers() {
    pkill -TERM -f -- "$work/" 2> /dev/null
    for _ in $(seq 20); do pgrep -f -- "$work/" > /dev/null || return 0; sleep 0.1; done
    pkill -KILL -f -- "$work/" 2> /dev/null
    sleep 0.2
}

cleanup() {
    [[ -n $mps_on || -d $work/mps ]] && stop_mps
    stop_broker
    kill_leftovers
    if [[ $logs == "$work"/* ]]; then
        rm -rf "${work:?}/bin" "$work/py" "$work/cells" "$work/mps" "$work/policy.toml" "$sock"
    else
        rm -rf "$work"
    fi
}
# ---- brokers and MPS ---------------------------------------------------------------------
start_broker() { # start_broker SETUP LOG
    local policy=$work/policy.toml
    {
        echo "scheduler = \"$scheduler\""
        echo '[priority]'
        if [[ $1 == cons-lowsm ]]; then
            echo "lower_sm_share = $lowsm_share"
        elif [[ $1 == cons-domain-beside ]]; then
            echo 'beside_other_contexts = true'
        fi
        tr ';' '\n' <<< "$priority_opts" | sed 's/^ *//'
        echo '[defaults]'
        echo 'class = "high"' # granted to all; each program asks for its class with --class
        if [[ $1 == cons-domain* ]]; then
            echo '[[users]]'
            echo "name = \"$hp_user\""
            echo 'class = "high"'
            echo 'trust_domain = "hp"'
        fi
    } > "$policy"
    cp "$policy" "${2%.broker.log}.policy.toml"
    # shellcheck disable=SC2086 # BROKER_ARGS is a list of words
    "$bin/gpushared" --socket "$sock" --socket-mode 0666 --backend "$backend" --config "$policy" \
        --log "$broker_log" $broker_args > "$2" 2>&1 &
    broker_pid=$!
    for _ in $(seq 300); do
        "$work/bin/gpushare" --socket "$sock" status > /dev/null 2>&1 && return 0
        kill -0 "$broker_pid" 2> /dev/null || break
        sleep 0.1
    done
    return 1
}

stop_broker() {
    [[ -n $broker_pid ]] || return 0
    kill -TERM "$broker_pid" 2> /dev/null
    for _ in $(seq 100); do kill -0 "$broker_pid" 2> /dev/null || break; sleep 0.1; done
    kill -KILL "$broker_pid" 2> /dev/null
    wait "$broker_pid" 2> /dev/null
    broker_pid=
}

mps_pids() { # the MPS daemon and servers started with our pipe folder, and their children
    local p found=()
    for p in $(pgrep -f nvidia-cuda-mps); do
        tr '\0' '\n' < "/proc/$p/environ" 2> /dev/null | grep -qx "CUDA_MPS_PIPE_DIRECTORY=$work/mps/pipe" && found+=("$p")
    done
    for p in "${found[@]}"; do echo "$p"; pgrep -P "$p"; done | sort -u
}

start_mps() { # start_mps LOG_PREFIX
    rm -rf "$work/mps"
    mkdir -p "$work/mps/pipe" "$work/mps/log"
    chmod 777 "$work/mps" "$work/mps/pipe" "$work/mps/log"
    export CUDA_MPS_PIPE_DIRECTORY=$work/mps/pipe CUDA_MPS_LOG_DIRECTORY=$work/mps/log
    mps_on=1
    timeout 20 nvidia-cuda-mps-control -d >> "$1.mps-control.log" 2>&1 || return 1
    sleep 0.3
}

stop_mps() { # stop_mps [LOG_PREFIX]
    echo quit | timeout 15 nvidia-cuda-mps-control > /dev/null 2>&1
    for _ in $(seq 50); do [[ -z $(mps_pids) ]] && break; sleep 0.2; done
    local left
    left=$(mps_pids)
    if [[ -n $left ]]; then
        echo "   (MPS did not quit; killing $(echo "$left" | tr '\n' ' '))"
        # shellcheck disable=SC2086
        kill -KILL $left 2> /dev/null
    fi
    if [[ -n ${1:-} ]]; then
        for f in "$work"/mps/log/*; do [[ -f $f ]] && cp "$f" "$1.mps.$(basename "$f")"; done
    fi
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
    mps_on=
}

trap cleanup EXIT
on_signal() { # stop the cell's programs first, then show what was measured so far
    echo "interrupted" >&2
    kill_leftovers
    [[ -s $results ]] && "$py" "$dir/colocate/summarize.py" "$results"
    exit 130
}
trap on_signal INT TERM

# ---- what can run here -------------------------------------------------------------------
for f in hp.py be.py common.py record.py summarize.py; do
    [[ -e $dir/colocate/$f ]] || { echo "missing $dir/colocate/$f: run scripts/gpu-bundle.sh and copy its folder" >&2; exit 2; }
done
if [[ $device == cpu ]]; then
    "$py" -c 'import torch' || { echo "$py cannot import torch (set PYTHON)" >&2; exit 2; }
else
    "$py" -c 'import torch; assert torch.cuda.is_available()' ||
        { echo "$py cannot use the GPU through torch (set PYTHON, or COLO_DEVICE=cpu)" >&2; exit 2; }
fi
if [[ $users == two ]]; then
    [[ $(id -u) == 0 ]] || { echo "USERS=two needs root (to run the HP program as $hp_user)" >&2; exit 2; }
    id "$hp_user" > /dev/null 2>&1 || useradd -M -s /usr/sbin/nologin "$hp_user" ||
        { echo "cannot create user $hp_user" >&2; exit 2; }
elif [[ $users != same ]]; then
    echo "USERS must be same or two" >&2; exit 2
fi

# The programs, gpushare run and its libraries where another user can read them.
mkdir -p "$work/py" "$work/bin/cuda" "$work/cells"
cp "$dir"/colocate/*.py "$work/py/"
have_broker=1
missing_bin=
for f in gpushared gpushare libcuda.so libgpushare_audit.so libgpushare_interpose.so; do
    if [[ -e $bin/$f ]]; then
        [[ $f == gpushared ]] || cp "$bin/$f" "$work/bin/"
    else
        have_broker=; missing_bin+=" $f"
    fi
done
ln -s ../libcuda.so "$work/bin/cuda/libcuda.so.1"
ln -s ../libcuda.so "$work/bin/cuda/libcuda.so"
chmod -R a+rX "$work/py" "$work/bin"
chmod 755 "$work/cells"

as_hp=()
if [[ $users == two ]]; then
    as_hp=(setpriv --reuid "$hp_user" --regid "$hp_user" --init-groups env HOME=/tmp)
    (cd / && "${as_hp[@]}" "$py" -c 'import torch' 2>&1) ||
        { echo "$hp_user cannot run $py with torch (PYTHON must be readable by every user)" >&2; exit 2; }
fi

skip_reason() { # skip_reason SETUP: prints why SETUP cannot run here (nothing if it can)
    case $1 in
        alone | plain) ;;
        mps)
            command -v nvidia-cuda-mps-control > /dev/null || echo "nvidia-cuda-mps-control not found" ;;
        governed | cons | cons-lowsm | cons-domain | cons-domain-beside)
            if [[ -z $have_broker ]]; then echo "missing in $bin:$missing_bin (set BIN, or run from the bundle)"
            elif [[ $1 == cons-lowsm ]] && ! grep -qa lower_sm_share "$bin/gpushared"; then
                echo "this gpushared's priority policy has no lower_sm_share setting"
            elif [[ $1 == cons-domain* && $users != two ]]; then
                echo "a trust domain of the HP program's own needs USERS=two"
            fi ;;
        *) echo "unknown setup" ;;
    esac
}

# ---- the cells ---------------------------------------------------------------------------
cells=() # "SETUP PAIR TRAINERS HP_ON" for one round
run_setups=()
for s in $setups; do
    why=$(skip_reason "$s")
    if [[ -n $why ]]; then echo "SKIP setup $s: $why"; continue; fi
    run_setups+=("$s")
done
for s in "${run_setups[@]}"; do
    for p in $pairs; do
        [[ $p == mlp || $p == bert ]] || { echo "unknown pair $p (mlp or bert)" >&2; exit 2; }
        if [[ $s == alone ]]; then
            cells+=("alone $p 0 1" "alone $p 1 0")
        else
            for n in $trainer_counts; do cells+=("$s $p $n 1"); done
        fi
    done
done
total=$((${#cells[@]} * rounds))
[[ $total -gt 0 ]] || { echo "nothing to run" >&2; exit 2; }
# Estimate: start-up, warm-up and teardown around each window (a guess: ~9 s on an H100 box);
# under MPS with two users the HP program waits out STRAGGLER_S instead of a window.
per_cell=$([[ $device == cpu ]] && echo 14 || echo 9)
blocked=0
[[ $users == two ]] && for c in "${cells[@]}"; do [[ $c == mps* ]] && blocked=$((blocked + rounds)); done
est=$(awk -v n="$total" -v s="$secs" -v o="$per_cell" -v b="$blocked" -v w="$straggler" \
    'BEGIN { printf "%.1f", (n * (s + o) + b * (w - s)) / 60 }')
echo "## colocate: run $run_id; $total cells ($rounds rounds x ${#cells[@]}) of ${secs}s windows; estimate ~${est} min (~$((per_cell + ${secs%.*}))s a cell)"
echo "setups: ${run_setups[*]}; pairs: $pairs; trainers: $trainer_counts; users: $users; think ${think} ms; device $device"
if [[ $device != cpu ]]; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader 2> /dev/null | sed 's/^/gpu: /'
    pgrep -x nvidia-cuda-mps-control > /dev/null && echo "warning: an MPS control daemon is already running on this machine"
fi
"$py" -c 'import torch; print("torch", torch.__version__)'
echo "logs and results: $logs (results: $results)"

# ---- one cell ----------------------------------------------------------------------------
# launch NAME HP? SETUP CLASS PROGRAM ARGS...: one program of the cell, in the background.
launch() {
    local name=$1 is_hp=$2 setup=$3 class=$4
    shift 4
    local prefix=()
    [[ $is_hp == 1 ]] && prefix+=("${as_hp[@]}")
    case $setup in
        governed) prefix+=("$work/bin/gpushare" --socket "$sock" run --mode governed
                           --interposer "$work/bin/libgpushare_interpose.so" --class "$class" --name "$name" --) ;;
        cons | cons-lowsm | cons-domain | cons-domain-beside) prefix+=("$work/bin/gpushare" --socket "$sock" run --class "$class" --name "$name" --) ;;
    esac
    (cd "$work" && exec timeout -k 5 "$step_timeout" "${prefix[@]}" "$py" "$@" \
        --ready "$cell/$name.ready" --go "$cell/go" --out "$cell/$name.json" --seconds "$secs" \
        --name "$name" --go-timeout "$((ready_timeout + 60))" > /dev/null 2>> "$logs/$id.$name.err") &
    pids+=($!)
    names+=("$name")
}

run_cell() { # run_cell ROUND SETUP PAIR TRAINERS HP_ON
    local round=$1 setup=$2 pair=$3 n=$4 hp_on=$5
    id=r$round-$setup-$pair-t$n
    [[ $setup == alone ]] && id=r$round-alone-$pair-$([[ $hp_on == 1 ]] && echo hp || echo be)
    id=$run_id-$id
    cell=$work/cells/$id
    mkdir -p "$cell"
    chmod 777 "$cell"
    pids=()
    names=()
    local t0 status=ok partition="" i
    t0=$(now)
    case $setup in
        governed | cons | cons-lowsm | cons-domain | cons-domain-beside)
            start_broker "$setup" "$logs/$id.broker.log" ||
                status="failed: gpushared did not start: $(tail -1 "$logs/$id.broker.log" 2> /dev/null)" ;;
        mps) start_mps "$logs/$id" || status="failed: nvidia-cuda-mps-control -d failed" ;;
    esac
    local hp_model=$pair hp_batch=$hp_batch_mlp be_model=mlp
    [[ $pair == bert ]] && { hp_batch=$hp_batch_bert; be_model=transformer; }
    if [[ $status == ok ]]; then
        [[ $hp_on == 1 ]] && launch hp 1 "$setup" high "$work/py/hp.py" --model "$hp_model" \
            --batch "$hp_batch" --think-ms "$think" --dtype "$hp_dtype"
        for ((i = 0; i < n; i++)); do
            launch "be$i" 0 "$setup" best-effort "$work/py/be.py" --model "$be_model" --grace "$grace" ${BE_GRAPHS:+--graph}
        done
        # Wait until every program is ready; give up on one that died, on the whole cell
        # after READY_TIMEOUT, or on stragglers STRAGGLER_S after the others were all ready.
        local ready=0 dead=() last_ready_at=$t0 all=${#names[@]}
        while :; do
            local r=0 d=() k
            for k in "${!names[@]}"; do
                if [[ -e $cell/${names[$k]}.ready ]]; then r=$((r + 1))
                elif ! kill -0 "${pids[$k]}" 2> /dev/null; then d+=("${names[$k]}"); fi
            done
            [[ $r -gt $ready ]] && { ready=$r; last_ready_at=$(now); }
            [[ $ready -eq $all ]] && break
            if [[ ${#d[@]} -gt 0 ]]; then dead=("${d[@]}"); break; fi
            if awk -v a="$t0" -v b="$(now)" -v t="$ready_timeout" 'BEGIN { exit !(b - a > t) }' ||
                { [[ $ready -gt 0 ]] && awk -v a="$last_ready_at" -v b="$(now)" -v t="$straggler" 'BEGIN { exit !(b - a > t) }'; }; then
                break
            fi
            sleep 0.1
        done
        if [[ $ready -eq $all ]]; then
            awk -v t="$(now)" 'BEGIN { printf "%.6f\n", t + 0.3 }' > "$cell/go.tmp"
            chmod 644 "$cell/go.tmp"
            mv "$cell/go.tmp" "$cell/go"
            local deadline mid status_taken=
            deadline=$(awk -v t="$(now)" -v s="$secs" -v e="$exit_timeout" -v g="$grace" 'BEGIN { printf "%.3f", t + 0.3 + s + g + e }')
            mid=$(awk -v t="$(now)" -v s="$secs" 'BEGIN { printf "%.3f", t + 0.3 + s / 2 }')
            while :; do
                # Mid-window, the broker's view of the cell's clients (their classes, modes).
                if [[ -n $broker_pid && -z $status_taken ]] && awk -v d="$mid" -v b="$(now)" 'BEGIN { exit !(b > d) }'; then
                    timeout 5 "$work/bin/gpushare" --socket "$sock" status --json > "$cell/status.json" 2>> "$logs/$id.broker.log"
                    status_taken=1
                fi
                local alive=0
                for i in "${pids[@]}"; do kill -0 "$i" 2> /dev/null && alive=1; done
                [[ $alive == 0 ]] && break
                if awk -v d="$deadline" -v b="$(now)" 'BEGIN { exit !(b > d) }'; then
                    status="timeout: programs still running ${exit_timeout}s after the window"; break
                fi
                sleep 0.1
            done
        elif [[ ${#dead[@]} -gt 0 ]]; then
            status="failed: ${dead[*]} exited before getting ready"
        else
            local waiting=()
            for k in "${!names[@]}"; do [[ -e $cell/${names[$k]}.ready ]] || waiting+=("${names[$k]}"); done
            if [[ $setup == mps && $users == two && $ready -gt 0 ]]; then
                status="blocked: MPS serves one user at a time (${waiting[*]} never ready; the others were)"
            else
                status="not ready: ${waiting[*]} within the time allowed"
            fi
        fi
    fi
    # Programs' exit statuses (those that ended by themselves), then everything of the cell goes.
    local rcs="" rc
    for k in "${!pids[@]}"; do
        if ! kill -0 "${pids[$k]}" 2> /dev/null; then
            wait "${pids[$k]}" 2> /dev/null; rc=$?
            rcs+="${rcs:+, }\"${names[$k]}\": $rc"
        fi
    done
    kill_leftovers
    for i in "${pids[@]}"; do wait "$i" 2> /dev/null; done
    [[ $setup == mps ]] && stop_mps "$logs/$id"
    if [[ -n $broker_pid ]]; then
        stop_broker
        if [[ $setup == cons-lowsm && $status != failed:* ]]; then
            if grep -q "SM partition made" "$logs/$id.broker.log"; then
                partition="made: $(grep "SM partition made" "$logs/$id.broker.log" | head -1 | grep -o 'sms=[0-9]*')"
            elif grep -q "no SM partitions" "$logs/$id.broker.log"; then
                partition="none on this GPU (BE rate-controlled instead)"
            else
                partition="not reported"
            fi
        fi
    fi
    kill_leftovers
    local meta
    meta=$(printf '{"run": "%s", "round": %d, "setup": "%s", "pair": "%s", "trainers": %d, "hp_on": %s, "users": "%s", "secs": %s, "think_ms": %s, "hp_batch": %d, "hp_dtype": "%s", "device": "%s", "cell": "%s", "wall_s": %s, "partition": "%s", "lowsm_share": %s, "rcs": {%s}, "time": "%s"}' \
        "$run_id" "$round" "$setup" "$pair" "$n" "$([[ $hp_on == 1 ]] && echo true || echo false)" "$users" \
        "$secs" "$think" "$hp_batch" "$hp_dtype" "$device" "$id" "$(since "$t0")" "$partition" \
        "$([[ $setup == cons-lowsm ]] && echo "$lowsm_share" || echo null)" "$rcs" "$(date -Iseconds)")
    cell_result=$("$py" "$work/py/record.py" "$cell" "$results" "$meta" "$status" "$logs/$id")
}

# ---- the rounds --------------------------------------------------------------------------
start_all=$(now)
done_cells=0
for round in $(seq "$rounds"); do
    for c in "${cells[@]}"; do
        read -r s p n h <<< "$c"
        done_cells=$((done_cells + 1))
        t_cell=$(now)
        label="$s $p $([[ $s == alone ]] && { [[ $h == 1 ]] && echo "HP alone" || echo "BE alone"; } || echo "${n} BE")"
        cell_result="no record"
        run_cell "$round" "$s" "$p" "$n" "$h"
        printf '[%d/%d round %d] %-22s %s (%ss; total %ss)\n' "$done_cells" "$total" "$round" "$label" \
            "$cell_result" "$(since "$t_cell")" "$(since "$start_all")"
    done
done

echo
echo "## medians across $rounds rounds (this run: $run_id)"
"$py" "$dir/colocate/summarize.py" "$results"
echo "results: $results"
