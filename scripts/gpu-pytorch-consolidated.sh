#!/usr/bin/env bash
# Consolidated clients with PyTorch on a GPU machine: correctness against the same programs run
# directly, then speed side by side, rounds interleaved. Runs from the folder that
# scripts/gpu-bundle.sh makes (gpushared, gpushare, libcuda.so, consolidated/); needs python3
# with a CUDA build of torch, a C compiler for consolidated/launch.c (or a prebuilt
# consolidated/launch), and no Rust toolchain.
#
#   correctness: an MLP and a small bf16 transformer train (deterministic, fixed seed) and must
#     give the same loss at every step and the same parameters as run directly; transformer
#     inference must give the same bytes; CUDA graph capture/replay and torch.compile must work
#     or fail cleanly; a memory quota must refuse and leave the program going; as root, two
#     programs of two other Unix users at once, each with its own quota, must also match.
#   speed: transformer training steps/s, MLP inference (back to back, and after think time),
#     tiny-kernel launch rate through PyTorch, empty-kernel launch rate and round trip through
#     the driver API (consolidated/launch.c), and time to the first finished CUDA op.
#
# Usage: ./gpu-pytorch-consolidated.sh [ROUNDS [SECONDS]] (default 3 rounds of 4 s). Logs and
# results.jsonl go to $LOGS (default a temporary folder); prints markdown tables. Exit status:
# non-zero if a check failed. GPUSHARE_CUDA_TRACE=1 names every failing driver call;
# STEP_TIMEOUT (default 300) bounds each program in seconds; SECTIONS (default "correctness
# memory speed") and BENCHES (default "train infer think launch first driver") pick parts;
# BROKER_ARGS adds arguments to gpushared (e.g. --in-process-device).
set -uo pipefail
dir=$(cd "$(dirname "$0")" && pwd)
rounds=${1:-3}
secs=${2:-4}
py=${PYTHON:-python3}
work=$(mktemp -d)
logs=${LOGS:-$work}
mkdir -p "$logs"
sock=$work/gpushare.sock
broker_pid=
failed=0
trap 'stop_broker; rm -rf "$work"' EXIT

for f in gpushared gpushare libcuda.so libgpushare_audit.so consolidated/correct.py consolidated/speed.py; do
    [[ -e $dir/$f ]] || { echo "missing $dir/$f: run scripts/gpu-bundle.sh and copy its folder" >&2; exit 2; }
done
launch=$dir/consolidated/launch
if [[ ! -x $launch ]]; then
    cc -O2 -o "$work/launch" "$dir/consolidated/launch.c" -ldl || exit 2
    launch=$work/launch
fi
# Other users' programs need the socket, gpushare run and the scripts: all under $work.
chmod 755 "$work"
mkdir -p "$work/py"
cp "$dir"/consolidated/*.py "$work/py/"
chmod -R a+rX "$work/py"
cd "$work/py"

# `gpushare run` and the libraries it puts in front of a program, where every user can read
# them: the driver in cuda/ (first on LD_LIBRARY_PATH) and the LD_AUDIT redirect.
mkdir -p "$work/bin/cuda"
cp "$dir/gpushare" "$dir/libcuda.so" "$dir/libgpushare_audit.so" "$work/bin/"
ln -s ../libcuda.so "$work/bin/cuda/libcuda.so.1"
ln -s ../libcuda.so "$work/bin/cuda/libcuda.so"
chmod -R a+rX "$work/bin"

start_broker() { # start_broker [POLICY-LINES...]
    printf '%s\n' 'scheduler = "fifo"' "$@" > "$work/policy.toml"
    # shellcheck disable=SC2086 # BROKER_ARGS is a list of words
    "$dir/gpushared" --socket "$sock" --socket-mode 0666 --backend "${BACKEND:-cuda}" --config "$work/policy.toml" \
        --no-telemetry --log warn ${BROKER_ARGS:-} 2>> "$logs/broker.log" &
    broker_pid=$!
    for _ in $(seq 100); do
        "$dir/gpushare" --socket "$sock" status > /dev/null 2>&1 && return 0
        sleep 0.1
    done
    echo "gpushared did not start:" >&2; cat "$logs/broker.log" >&2; exit 1
}

stop_broker() {
    if [[ -n $broker_pid ]]; then
        kill -TERM "$broker_pid" 2> /dev/null
        wait "$broker_pid" 2> /dev/null
        broker_pid=
    fi
}

# run TAG MODE [as USER] CMD...: the program directly (MODE direct) or consolidated
# (`gpushare run`, its default mode), as another Unix user if asked; its last stdout line, a
# JSON object, goes tagged into results.jsonl and to stdout; its stderr to TAG.MODE.err.
run() {
    local tag=$1 mode=$2 line rc
    shift 2
    local prefix=()
    if [[ $1 == as ]]; then
        prefix=(setpriv --reuid "$2" --regid "$2" --clear-groups env HOME=/tmp)
        shift 2
    fi
    [[ $mode == consolidated ]] && prefix+=("$work/bin/gpushare" --socket "$sock" run --)
    line=$(timeout "${STEP_TIMEOUT:-300}" "${prefix[@]}" "$@" 2>> "$logs/$tag.$mode.err" | tail -1)
    rc=${PIPESTATUS[0]}
    [[ $line == "{"* ]] || line='{"ok": false, "error": "no result"}'
    echo "{\"tag\": \"$tag\", \"mode\": \"$mode\", \"r\": $line}" >> "$logs/results.jsonl"
    echo "$line"
}

same() { # same TAG FIELD...: the direct and consolidated results agree on every FIELD
    local tag=$1
    shift
    if "$py" - "$logs/results.jsonl" "$tag" "$@" <<'PY'; then echo "PASS $tag: ${*}"; else failed=1; fi
import json, sys
path, tag, fields = sys.argv[1], sys.argv[2], sys.argv[3:]
rows = [json.loads(l) for l in open(path)]
by = {r["mode"]: r["r"] for r in rows if r["tag"] == tag}
d, c = by.get("direct", {}), by.get("consolidated", {})
bad = [f for f in fields if f not in d or d.get(f) != c.get(f)]
if bad or not d.get("ok") or not c.get("ok"):
    first = next((i for i, (a, b) in enumerate(zip(d.get("losses", []), c.get("losses", []))) if a != b), None)
    print(f"FAIL {tag}: differs in {bad}; first differing step {first}; direct {str(d)[:300]}; consolidated {str(c)[:300]}")
    sys.exit(1)
PY
}

check() { # check TAG EXPR-ON-r: the consolidated result r satisfies EXPR
    local tag=$1 expr=$2
    if "$py" - "$logs/results.jsonl" "$tag" "$expr" <<'PY'; then :; else failed=1; fi
import json, sys
path, tag, expr = sys.argv[1:4]
rows = [json.loads(l) for l in open(path)]
r = [x["r"] for x in rows if x["tag"] == tag and x["mode"] == "consolidated"][-1]
good = eval(expr, {"r": r})
clean = "" if r.get("ok") else f" (failed cleanly: {r.get('error', '')[:120]!r})"
print(f"{'PASS' if good else 'FAIL'} {tag}: {expr}{clean}" + ("" if good else f" — {r}"))
sys.exit(0 if good else 1)
PY
}

sections=${SECTIONS:-correctness memory speed}
benches=${BENCHES:-train infer think launch first driver}
want() { [[ " $sections $benches " == *" $1 "* ]]; }

if want correctness; then
echo "## correctness"
start_broker
for m in direct consolidated; do
    run train-mlp $m "$py" correct.py train --model mlp --steps 300 > /dev/null
    run train-transformer $m "$py" correct.py train --model transformer --steps 300 > /dev/null
    run infer $m "$py" correct.py infer > /dev/null
done
same train-mlp losses checksum
same train-transformer losses checksum
same infer sha256
run graphs consolidated "$py" correct.py graphs
check graphs 'r["ok"] and r["equal"] or not r["ok"]'
run compile consolidated "$py" correct.py compile
check compile 'r["ok"] and r["max_abs_diff"] < 1e-2 and r["repeat_equal"] or not r["ok"]'
stop_broker

start_broker '[defaults]' 'memory_quota = "4 GiB"'
run quota consolidated "$py" correct.py quota
check quota 'r["ok"] and r["oom"] and 2 <= r["allocated_gib"] <= 4 and abs(r["mem_total_gib"] - 4) < 0.01 and r["carried_on"]'
stop_broker

if [[ $(id -u) == 0 ]]; then
    for u in gsalice gsbob; do id "$u" > /dev/null 2>&1 || useradd -M -s /bin/false "$u"; done
    start_broker '[[users]]' 'name = "gsalice"' 'memory_quota = "6 GiB"' \
        '[[users]]' 'name = "gsbob"' 'memory_quota = "3 GiB"'
    pids=()
    for u in gsalice gsbob; do
        run "train-mlp-$u" consolidated as "$u" "$py" correct.py train --model mlp --steps 300 > /dev/null &
        pids+=($!)
        run "quota-$u" consolidated as "$u" "$py" correct.py quota > /dev/null &
        pids+=($!)
    done
    wait "${pids[@]}"
    stop_broker
    "$py" - "$logs/results.jsonl" <<'PY' || failed=1
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
r = {x["tag"]: x["r"] for x in rows}
ref = [x["r"] for x in rows if x["tag"] == "train-mlp" and x["mode"] == "direct"][0]
ok = True
for u, gib in (("gsalice", 6), ("gsbob", 3)):
    t, q = r.get(f"train-mlp-{u}", {}), r.get(f"quota-{u}", {})
    good = t.get("losses") is not None and t.get("losses") == ref.get("losses") and q.get("oom") and abs(q.get("mem_total_gib", 0) - gib) < 0.01
    print(("PASS" if good else "FAIL") + f" two users: {u} same losses as direct, quota {gib} GiB seen and enforced ({q.get('allocated_gib')} GiB allocated)")
    ok &= bool(good)
sys.exit(0 if ok else 1)
PY
else
    echo "SKIP two users: needs root to run programs as other users"
fi
fi

if want memory; then
echo
echo "## GPU memory a PyTorch process costs (memory.used of the whole GPU, MiB)"
start_broker
gpu_mib() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 | tr -d ' '; }
holders=()
hold() { # hold MODE NAME [STREAMS]: speed.py hold in the background, until it says it is ready
    local prefix=()
    [[ $1 == consolidated ]] && prefix=("$work/bin/gpushare" --socket "$sock" run --)
    "${prefix[@]}" "$py" speed.py hold --ready "$work/$2.ready" --seconds 60 --streams "${3:-0}" \
        > "$work/$2.json" 2>> "$logs/hold.err" &
    holders+=($!)
    for _ in $(seq 900); do [[ -e $work/$2.ready ]] && return 0; sleep 0.1; done
    echo "FAIL memory: $2 never got ready"; failed=1; return 1
}
release() { kill "${holders[@]}" 2> /dev/null; wait "${holders[@]}" 2> /dev/null; holders=(); sleep 1; }
m0=$(gpu_mib)
hold direct direct && m_direct=$(gpu_mib)
release
m_s0=$(gpu_mib)
hold direct streams 256 && m_streams=$(gpu_mib)
release
m1=$(gpu_mib)
hold consolidated first && m_first=$(gpu_mib)
hold consolidated second && m_second=$(gpu_mib)
"$work/bin/gpushare" --socket "$sock" status >> "$logs/memory.txt" 2>&1
release
"$py" - "$work" "$m0" "${m_direct:-0}" "$m1" "${m_first:-0}" "${m_second:-0}" "$m_s0" "${m_streams:-0}" <<'PY' | tee -a "$logs/memory.txt"
import json, sys
work, m0, md, m1, mf, ms, s0, s1 = sys.argv[1], *map(int, sys.argv[2:])
res = {n: json.load(open(f"{work}/{n}.json"))["reserved"] / 2**20 for n in ("direct", "first", "second")}
print("| | GPU memory used | of which PyTorch's allocations | the rest |")
print("|---|---|---|---|")
print(f"| gpushared alone (its context) | {m0} | – | – |")
print(f"| + one PyTorch process, direct | +{md - m0} | {res['direct']:.0f} | {md - m0 - res['direct']:.0f} (its own context) |")
print(f"| + one PyTorch process, consolidated | +{mf - m1} | {res['first']:.0f} | {mf - m1 - res['first']:.0f} |")
print(f"| + a second one, consolidated | +{ms - mf} | {res['second']:.0f} | {ms - mf - res['second']:.0f} |")
extra = json.load(open(f"{work}/streams.json"))
print(f"\nA direct process with {extra['streams']} more streams than the first: "
      f"+{s1 - s0} MiB against +{md - m0} MiB ({(s1 - s0 - (md - m0)) / extra['streams'] * 1024:.0f} KiB a stream)")
PY
stop_broker
fi

if want speed; then
echo
echo "## speed ($rounds rounds of ${secs}s, interleaved)"
start_broker
for r in $(seq "$rounds"); do
    for m in direct consolidated; do
        for b in train infer think launch; do
            want $b && run "speed-$b" $m "$py" speed.py $b --seconds "$secs" > /dev/null
        done
        want first && run speed-first $m "$py" speed.py first --t0-ns "$(date +%s%N)" > /dev/null
        want driver && run speed-driver $m "$launch" 200000 1000 2000 > /dev/null
    done
done
stop_broker
"$py" - "$logs/results.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
goals = [  # (tag, field, what, higher is better, goal as consolidated / direct)
    ("speed-train", "steps_per_s", "transformer training steps/s", True, 0.95),
    ("speed-infer", "p50_ms", "MLP inference request p50 (ms)", False, 1.05),
    ("speed-think", "pooled_p99_ms", "inference after think time p99, all rounds' requests (ms)", False, 1.10),
    ("speed-think", "p99_ms", "inference after think time p99, median of rounds (ms)", False, None),
    ("speed-think", "pooled_p50_ms", "inference after think time p50, all rounds' requests (ms)", False, None),
    ("speed-launch", "kernels_per_s", "tiny PyTorch kernels/s", True, 0.9),
    ("speed-driver", "launches_s", "empty kernels/s (driver API)", True, 0.9),
    ("speed-driver", "rtt_p50_us", "launch + sync round trip p50 (us)", False, None),
    ("speed-driver", "rtt_p99_us", "launch + sync round trip p99 (us)", False, None),
    ("speed-driver", "alloc_512b_us", "cuMemAlloc of 512 B, 1000 kept live, median (us)", False, None),
    ("speed-driver", "alloc_2mib_us", "cuMemAlloc of 2 MiB (then freed), median (us)", False, None),
    ("speed-driver", "alloc_64mib_us", "cuMemAlloc of 64 MiB (then freed), median (us)", False, None),
    ("speed-first", "from_start_s", "start to first CUDA op, PyTorch (s)", False, 1.5),
    ("speed-driver", "first_op_s", "start to first CUDA op, driver API (s)", False, 1.5),
]
def pooled(tag, mode, q):
    xs = sorted(v for x in rows if x["tag"] == tag and x["mode"] == mode for v in x["r"].get("lat_us", []))
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] / 1e3 if xs else None
for x in rows:
    if x["tag"] == "speed-think":
        x["r"]["pooled_p99_ms"] = pooled("speed-think", x["mode"], 0.99)
        x["r"]["pooled_p50_ms"] = pooled("speed-think", x["mode"], 0.5)
print("| measure | direct | consolidated | ratio | goal |")
print("|---|---|---|---|---|")
for tag, field, what, higher, goal in goals:
    med = {}
    for mode in ("direct", "consolidated"):
        xs = [x["r"][field] for x in rows if x["tag"] == tag and x["mode"] == mode and x["r"].get(field) is not None]
        med[mode] = statistics.median(xs) if xs else None
    d, c = med["direct"], med["consolidated"]
    if d is None or c is None:
        print(f"| {what} | {d} | {c} | – | missing |")
        continue
    ratio = c / d
    verdict = "–"
    if goal is not None:
        met = ratio >= goal if higher else ratio <= goal
        verdict = f"{'≥' if higher else '≤'} {goal} {'met' if met else 'MISSED'}"
    print(f"| {what} | {d:.4g} | {c:.4g} | {ratio:.3f} | {verdict} |")
PY
fi
exit $failed
