#!/usr/bin/env bash
# CUDA graphs through gpushare against the same program run directly, side by side: the
# decode loop of scripts/coverage/decode_prog.py (a GPT-2-sized decoder, one CUDA graph per
# token) run directly, consolidated (`gpushare run`: gpushared makes each graph a real CUDA
# graph and launches it as one unit), and consolidated with GPUSHARE_GRAPHS=replay (the graph's
# kernels sent one by one, as before), in interleaved rounds. Prints each run's p50 and p99 step
# time, then a table of the medians over rounds and their ratios to direct, and whether every
# run generated the same tokens as the first direct one.
#
# Runs from the folder scripts/gpu-bundle.sh makes. Usage: ./gpu-graph-bench.sh [ROUNDS]
# (default 3). MODES (default "graph compiled") picks decode_prog.py's modes; STEP_TIMEOUT
# (default 300) bounds each run in seconds.
set -uo pipefail
dir=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-python3}
rounds=${1:-3}
work=$(mktemp -d)
sock=$work/gpushare.sock
broker_pid=
trap '[[ -n $broker_pid ]] && kill -TERM $broker_pid 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT

"$dir/gpushared" --socket "$sock" --backend "${BACKEND:-cuda}" --no-telemetry --log warn \
    2>> "${LOGS:-$work}/broker.log" &
broker_pid=$!
for _ in $(seq 100); do
    "$dir/gpushare" --socket "$sock" status > /dev/null 2>&1 && break
    sleep 0.1
done

results=$work/results.jsonl
for mode in ${MODES:-graph compiled}; do
    for r in $(seq "$rounds"); do
        for how in direct graphs replay; do
            case $how in
            direct) cmd=("$py" "$dir/coverage/decode_prog.py" "$mode") ;;
            graphs) cmd=("$dir/gpushare" --socket "$sock" run -- "$py" "$dir/coverage/decode_prog.py" "$mode") ;;
            replay) cmd=(env GPUSHARE_GRAPHS=replay "$dir/gpushare" --socket "$sock" run -- "$py" "$dir/coverage/decode_prog.py" "$mode") ;;
            esac
            line=$(timeout "${STEP_TIMEOUT:-300}" "${cmd[@]}" 2>> "${LOGS:-$work}/$mode.$how$r.err" | tail -1)
            [[ $line == "{"* ]] || line='{"ok": false, "error": "no result"}'
            echo "$line" | "$py" -c 'import json,sys; d=json.load(sys.stdin); d.update(mode=sys.argv[1], how=sys.argv[2], round=int(sys.argv[3])); print(json.dumps(d))' "$mode" "$how" "$r" >> "$results"
            tail -1 "$results" | "$py" -c 'import json,sys; d=json.load(sys.stdin); print(d["mode"], d["how"], d["round"], "p50 %.3f ms p99 %.3f ms" % (d["ms"], d["p99"]) if d.get("ok") else d.get("error"))'
        done
    done
done

"$py" - "$results" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print()
print("| decode step | how | p50 ms | p99 ms | p50 / direct | p99 / direct | capture ms | tokens |")
print("|---|---|---|---|---|---|---|---|")
for mode in dict.fromkeys(r["mode"] for r in rows):
    runs = [r for r in rows if r["mode"] == mode]
    first = next((r for r in runs if r["how"] == "direct" and r.get("ok")), None)
    base = {}
    for how in ("direct", "graphs", "replay"):
        ok = [r for r in runs if r["how"] == how and r.get("ok")]
        if not ok:
            print(f"| {mode} | {how} | failed | | | | | |")
            continue
        p50 = statistics.median(r["ms"] for r in ok)
        p99 = statistics.median(r["p99"] for r in ok)
        cap = statistics.median(r["capture_ms"] for r in ok) if "capture_ms" in ok[0] else None
        base.setdefault("p50", p50)
        base.setdefault("p99", p99)
        same = first is not None and all(r["values"] == first["values"] for r in ok)
        print(f"| {mode} | {how} | {p50:.3f} | {p99:.3f} | {p50 / base['p50']:.2f} | "
              f"{p99 / base['p99']:.2f} | {'' if cap is None else f'{cap:.1f}'} | "
              f"{'same' if same else 'DIFFER'} |")
PY
